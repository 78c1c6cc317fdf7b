#!/usr/bin/env bash
# One device call for the decode-side FP8 kernels and the scorer's top-k (issues 11, 15): build, then
#   bench_decode --index-only (scorer checks against the CPU twin, timings, --trace of the top-k tail), then
#   --attn-only --trace (the attention's merge stamps),
#   gpu_decode_test's DecodeIndex cases, gpu_gemv_test, gpu_moe_test,
#   bench_gemv (cuBLASLt / W8A16 mma / gemv_e4m3 CUDA cores vs tensor cores at M3 shapes), bench_moe --fp8.
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_fp8_decode_run.sh $OUT`  (≈ 6–8 min cold)
# env: M3_FP8_SKIP_SCORER=1, M3_FP8_SKIP_MOE=1, M3_FP8_SKIP_GEMV=1 (skip those parts), M3_FP8_DECODE_FILTER (gtest
# filter for gpu_decode_test, default '*DecodeIndex*'), M3_FP8_EXTRA_TESTS="gpu_graph_test …" (built and run whole),
# M3_FP8_MOE_T (bench_moe step sizes), M3_FP8_GEMV_SHAPES=0 (no second gemv test pass with the 256 x 3 ring).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_fp8_decode}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "${M3_FP8_SKIP_SCORER:-0}" != 1 ]; then
  M3_COMMIT="$c" timeout 150 bash tools/bench_decode/run_device.sh "$out/dec" --fp8 --index-only --batches 8,64 \
    --ctxs 16384,65536 --trace >"$out/bench_decode.txt" 2>&1
  echo "== bench_decode --index-only: rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "FAIL|mismatch|^\| |^trace" "$out/bench_decode.txt" | cut -c1-190 | head -30
  M3_COMMIT="$c" timeout 150 bash tools/bench_decode/run_device.sh "$out/dec_attn" --fp8 --attn-only --batches 8,32,64 \
    --ctxs 16384 --trace >"$out/bench_decode_attn.txt" 2>&1
  echo "== bench_decode --attn-only --trace: rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "FAIL|mismatch|^\| |^trace" "$out/bench_decode_attn.txt" | cut -c1-330 | head -20
fi
M3_TARGETS="gpu_decode_test gpu_gemv_test gpu_moe_test bench_gemv bench_moe ${M3_FP8_EXTRA_TESTS:-}" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 \
  M3_SKIP_E2E=1 timeout 330 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
echo "== build: $(tail -1 "$out/build/summary.md") ($(( $(date +%s) - t0 )) s)"
find_bin() { find build-gpu -name "$1" -type f | head -1; }
run_test() {  # name, filter, timeout
  local b; b=$(find_bin "$1")
  [ -n "$b" ] || { echo "== $1: not built"; return; }
  timeout "$3" "$b" --gtest_filter="$2" >"$out/$1.txt" 2>&1
  echo "== $1 ($2): rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  (PASSED|FAILED) |Failure|Which is|Expected" "$out/$1.txt" | head -12
  grep -hoE "\[gpu-op\].*" "$out/$1.txt" | cut -c1-200 | head -12
}
[ "${M3_FP8_SKIP_SCORER:-0}" != 1 ] && run_test gpu_decode_test "${M3_FP8_DECODE_FILTER:-*DecodeIndex*}" 200
for x in ${M3_FP8_EXTRA_TESTS:-}; do run_test "$x" '*' 200; done
if [ "${M3_FP8_SKIP_GEMV:-0}" != 1 ]; then
  run_test gpu_gemv_test '*' 150
  [ "${M3_FP8_GEMV_SHAPES:-1}" = 1 ] && M3_GEMV_MMA_SHAPE=256x3 run_test gpu_gemv_test '*E4m3*' 150
  B=$(find_bin bench_gemv)
  [ -n "$B" ] && { timeout 150 "$B" --t 1,2,4,8 >"$out/bench_gemv.txt" 2>&1; echo "== bench_gemv: rc $?"; }
  grep -E "^\| .*(e4m3|W8A16)" "$out/bench_gemv.txt" | head -60
  [ -n "$B" ] && { M3_GEMV_MMA_SHAPE=256x3 timeout 100 "$B" --t 1,2,8 >"$out/bench_gemv_256x3.txt" 2>&1;
    echo "== bench_gemv, tensor-core ring 256 B x 3 stages: rc $?"; }
  grep -E "^\| .*tensor cores" "$out/bench_gemv_256x3.txt" | head -20
fi
if [ "${M3_FP8_SKIP_MOE:-0}" != 1 ]; then
  run_test gpu_moe_test '*' 240
  B=$(find_bin bench_moe)
  [ -n "$B" ] && { timeout 120 "$B" --t "${M3_FP8_MOE_T:-1,8,64,2048}" --fp8 >"$out/bench_moe.txt" 2>&1; echo "== bench_moe --fp8: rc $?"; }
  grep -E "^\| [0-9]|^bf16 vs|^Eager|^GEMM" "$out/bench_moe.txt" | cut -c1-200 | head -36
fi
echo "total $(( $(date +%s) - t0 )) s (commit $c); record the results in bench/results/ (date, GPU, commit, command)"
