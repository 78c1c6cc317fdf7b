#!/usr/bin/env bash
# Soak / fault test of `m3serve serve` on the demo model, loopback only (scripts/soak.mjs does the work; see
# docs/SERVER.md "Soak test"). Bounded: M3_SOAK_SECONDS (default 40) of traffic, M3_SOAK_MAX_REQUESTS (100000),
# then a SIGTERM under load. CI runs it briefly (.ci/run); run it long on demand, e.g.
#   M3_SOAK_SECONDS=3600 M3_SOAK_CONCURRENCY=32 bash scripts/soak.sh
# Env: M3_BUILD_DIR (build), M3_SOAK_SEED (1), M3_SOAK_KV (1536KiB: small enough to preempt), M3_SOAK_RSS_MIB (64).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${M3_BUILD_DIR:-$root/build}"
bin="$build/bin/m3serve"
if [ ! -x "$bin" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target m3serve
fi
model="$build/soak_model"
bash "$root/scripts/make_demo_model.sh" "$model" >/dev/null
exec node "$root/scripts/soak.mjs" --bin "$bin" --model "$model" \
  --seconds "${M3_SOAK_SECONDS:-40}" --max-requests "${M3_SOAK_MAX_REQUESTS:-100000}" \
  --concurrency "${M3_SOAK_CONCURRENCY:-12}" --seed "${M3_SOAK_SEED:-1}" \
  --kv-cache-memory "${M3_SOAK_KV:-1536KiB}" --rss-growth-mib "${M3_SOAK_RSS_MIB:-64}"
