#!/usr/bin/env bash
# One device call (2026-12-03, sixth session) for the FP8 prefill's fused activation quantisation and the e4m3 decode
# attention's profile: the GPU tests the change touches (gpu_fp8_test's fused-writer tests are new), the 60k-token
# e2e in FP8 with the fused quantisation and without (M3_FP8_FUSED_QUANT=0), both with M3_STEP_PROFILE=2 (the
# prefill categories' host queueing time and GPU wait), then ncu of the e4m3 paged decode attention at B = 64, 16k
# (issue 15's ≤ 40 µs: where its time goes).
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_fp8_prefill_run.sh $OUT`   (≈ 6 minutes)
# Env: M3_FP8_RUN_SKIP_E2E=1 / M3_FP8_RUN_SKIP_NCU=1 skip those parts.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_fp8_prefill}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
c="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
e2e="fp8 fp8:M3_FP8_FUSED_QUANT=0"
[ "${M3_FP8_RUN_SKIP_E2E:-0}" = 1 ] && e2e=" "
M3_COMMIT="$c" M3_STEP_SKIP_DECODE=1 M3_STEP_TESTS="gpu_fp8_test gpu_model_test gpu_graph_test gpu_fp8_load_test" \
  M3_STEP_E2E="$e2e" bash scripts/gpu_step_run.sh "$out/step" 2>&1 | grep -v "^in order"
if [ "${M3_FP8_RUN_SKIP_NCU:-0}" != 1 ]; then
  M3_BENCH_BUILD_ONLY=1 timeout 120 bash tools/bench_decode/run_device.sh "$out/dec" >/dev/null 2>&1
  bd=/tmp/bench_decode_build/bench_decode
  if [ -x "$bd" ] && command -v ncu >/dev/null; then
    timeout 150 ncu --kernel-name-base demangled -k "regex:paged_decode_tc_kernel.*e4m3" -c 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
      --section InstructionStats --section MemoryWorkloadAnalysis \
      "$bd" --fp8 --attn-only --batches 64 --ctxs 16384 --no-checks >"$out/ncu_dec.txt" 2>&1
    echo "== ncu e4m3 paged decode B=64 16k: rc $?"
    grep -E "paged_decode|Duration|Throughput|Pipe|Issue|Eligible|Warp Cycles|Stall|Executed Ipc|Registers|Busy" \
      "$out/ncu_dec.txt" | cut -c1-150 | head -60
  else
    echo "== ncu: bench_decode not built or ncu missing"
  fi
fi
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
