#!/usr/bin/env bash
# One device call for what landed on 2026-12-03 (sixth session) without a run on the H200, to run FIRST next session:
# the MSA prefill route's absolute term (a tile whose union is ≤ top_k pages stays a union tile: gpu_msa_prefill_tc_test
# with its new expectations, then the 128 manifest cases for the chooser's "within 5 %" count), and gpu_vision_test
# (the ViT's official rotary variant, if it landed).
#   python3 scripts/prefill_cases.py (writes .gpucarry/prefill_cases.txt), then device `run`: carry
#   [".gpudeps", ".gpucarry"], command `bash scripts/gpu_pending_run.sh $OUT`   (≈ 4 minutes)
# Then, in a second call: `bash scripts/gpu_media_run.sh $OUT/media` (the 8-image TTFT with the encoder behind the
# engine's prefix match, never measured on the H200).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_pending}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
t0=$(date +%s)
M3_COMMIT="$commit" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 M3_SKIP_E2E=1 \
  M3_TARGETS="gpu_msa_prefill_tc_test gpu_vision_test bench_prefill_cases" timeout 240 bash scripts/gpu_run.sh \
  "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
find_bin() { find build-gpu -name "$1" -type f | head -1; }
for t in gpu_msa_prefill_tc_test gpu_vision_test; do
  b=$(find_bin "$t")
  [ -n "$b" ] || { echo "== $t: not built"; continue; }
  timeout 200 "$b" --gtest_brief=1 >"$out/$t.txt" 2>&1
  echo "== $t: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$out/$t.txt" | cut -c1-260 | head -12
done
C=$(find_bin bench_prefill_cases)
if [ -n "$C" ] && [ -f .gpucarry/prefill_cases.txt ]; then
  timeout 170 "$C" --cases .gpucarry/prefill_cases.txt --reps 7 >"$out/cases.txt" 2>&1
  echo "== bench_prefill_cases: rc $? (2026-12-03f before the absolute term: 110 / 128 random, 75 / 128 spread)"
  sed -n '/Representative-weighted/,$p' "$out/cases.txt"
fi
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
