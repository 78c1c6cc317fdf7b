#!/usr/bin/env bash
# One device call (2026-12-03, sixth session): the 60k-token e2e in bf16 and FP8 with the startup warm-up request
# (engine/warmup.h; M3_STEP_PROFILE=2, one line per eager prefill step), then the 128 prefill-manifest cases with
# the router skip for steps whose rows' selections are all fixed (bench_prefill_cases now plans Auto with the rows).
#   python3 scripts/prefill_cases.py first (writes .gpucarry/prefill_cases.txt), then device `run`: carry
#   [".gpudeps", ".gpucarry"], command `bash scripts/gpu_warmup_cases_run.sh $OUT`   (≈ 6 minutes)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_warmup_cases}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
c="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
M3_TARGETS="m3serve bench_prefill_cases" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 M3_SKIP_E2E=1 \
  timeout 300 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
M3_COMMIT="$c" M3_STEP_SKIP_DECODE=1 M3_STEP_SKIP_TESTS=1 M3_STEP_E2E="fp8 bfloat16" \
  bash scripts/gpu_step_run.sh "$out/step" 2>&1 | grep -v "^in order"
C=$(find build-gpu -name bench_prefill_cases -type f | head -1)
if [ -n "$C" ] && [ -f .gpucarry/prefill_cases.txt ]; then
  timeout 170 "$C" --cases .gpucarry/prefill_cases.txt --reps 7 >"$out/cases.txt" 2>&1
  echo "== bench_prefill_cases: rc $?"
  sed -n '/Representative-weighted/,$p' "$out/cases.txt"
fi
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
