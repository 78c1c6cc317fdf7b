#!/usr/bin/env bash
# The README's first command: set up a fresh machine and serve the bundled demo model on the CPU.
#   installs Debian packages → builds m3serve (CPU-only) → writes models/demo (random weights, real tokenizer)
#   → serves it at http://$HOST:$PORT (OpenAI-compatible; try the curl line printed below).
# Env: HOST (127.0.0.1), PORT (8000), M3_BUILD_DIR (build).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${M3_BUILD_DIR:-$root/build}"
bash "$root/scripts/install_deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DM3_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target m3serve
bash "$root/scripts/make_demo_model.sh" "$root/models/demo"
host="${HOST:-127.0.0.1}"
port="${PORT:-8000}"
cat <<MSG
Serving models/demo (random weights: the text is not meaningful) at http://$host:$port
  curl http://$host:$port/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model":"m3-demo","messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'
MSG
exec "$build/bin/m3serve" serve --model "$root/models/demo" --served-model-name m3-demo --host "$host" --port "$port"
