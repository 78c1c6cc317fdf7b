#!/usr/bin/env bash
# One device call (2026-12-03, sixth session) for the paged decode attention's pair loop (paged_decode_tc.cu kPair:
# two chunks per iteration; e4m3, and bf16 in the deep shape) and the FP8 prefill's per-step host profile:
#   bench_decode --fp8 --attn-only at B = 8 / 32 / 64, 16k (bf16 and e4m3; the e4m3 checks first), then the same
#   binary with M3_DECODE_PAIR=0 (A/B); gpu_decode_test (default, and M3_DECODE_PAIR=1: every pair loop),
#   gpu_graph_test, gpu_model_test, gpu_kv_fp8_test;
#   the 60k-token FP8 e2e with M3_STEP_PROFILE=2 (one line per eager prefill step: where the "head" wait sits);
#   ncu of the pair kernel at B = 64.
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_fp8_decode_run.sh $OUT`   (≈ 6 minutes)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_fp8_decode}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
c="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
M3_COMMIT="$c" timeout 150 bash tools/bench_decode/run_device.sh "$out/dec" --fp8 --attn-only --batches 8,32,64 \
  --ctxs 16384 >"$out/dec.txt" 2>&1
echo "== bench_decode attention (pair loop): rc $?"
grep -E "FAIL|e4m3 .*(ok|FAIL)|^\| paged" "$out/dec.txt" | cut -c1-200 | head -30
bd=/tmp/bench_decode_build/bench_decode
if [ -x "$bd" ]; then
  M3_DECODE_PAIR=0 timeout 90 "$bd" --fp8 --attn-only --batches 8,32,64 --ctxs 16384 --no-checks \
    >"$out/dec_nopair.txt" 2>&1
  echo "== bench_decode attention, M3_DECODE_PAIR=0: rc $?"
  grep -E "^\| paged" "$out/dec_nopair.txt" | head -16
fi
M3_COMMIT="$c" M3_STEP_SKIP_DECODE=1 M3_STEP_TESTS="gpu_decode_test gpu_graph_test gpu_model_test gpu_kv_fp8_test" \
  M3_STEP_E2E="fp8" bash scripts/gpu_step_run.sh "$out/step" 2>&1 | grep -v "^in order"
b=$(find build-gpu -name gpu_decode_test -type f | head -1)
if [ -n "$b" ]; then
  M3_DECODE_PAIR=1 timeout 200 "$b" --gtest_brief=1 >"$out/gpu_decode_test_allpair.txt" 2>&1
  echo "== gpu_decode_test M3_DECODE_PAIR=1: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_decode_test_allpair.txt" |
    tr '\n' ' ')"
fi
if [ -x "$bd" ] && command -v ncu >/dev/null; then
  timeout 120 ncu --kernel-name-base demangled -k "regex:paged_decode_tc_kernel.*e4m3" -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section InstructionStats "$bd" --fp8 --attn-only --batches 64 --ctxs 16384 --no-checks >"$out/ncu_dec.txt" 2>&1
  echo "== ncu e4m3 paged decode (pair) B=64 16k: rc $?"
  grep -E "Duration|Issue Slots|Issued Warp|Eligible Warps|No Eligible|Warp Cycles Per Issued|Issued Instructions  " \
    "$out/ncu_dec.txt" | cut -c1-120 | head -12
fi
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
