#!/usr/bin/env bash
# One device call for the grouped MoE (docs/KERNELS.md §10, docs/FP8.md §9): build, gpu_moe_test (bf16 and FP8
# experts against the CPU reference, graph replay, batch independence), bench_moe bf16 vs FP8 experts at decode and
# prefill sizes, an ncu of the FP8 gate/up GEMM at T = 8; then the KV-block-major prefill test and its default
# kernel at the issue-10 shapes.
#   device `run`: carry [".gpudeps"], command `bash scripts/gpu_moe_run.sh $OUT`   (≈ 5–6 minutes from cold)
# Env: M3_MOE_T (bench_moe step sizes, default 1,8,64,2048; at ≥ 512 both GEMM paths are timed, FP8's too),
# M3_MOE_NCU_PREFILL=1 (also an ncu of the FP8 e4m3 wgmma gate/up and down kernels at T = 8192),
# M3_MOE_SKIP_ATTN=1 (skip the prefill-attention part).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_moe}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
M3_TARGETS="gpu_moe_test bench_moe gpu_msa_prefill_tc_test bench_prefill_tc" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 \
  M3_SKIP_E2E=1 timeout 300 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
find_bin() { find build-gpu -name "$1" -type f | head -1; }
M=$(find_bin gpu_moe_test)
B=$(find_bin bench_moe)
T=$(find_bin gpu_msa_prefill_tc_test)
X=$(find_bin bench_prefill_tc)
[ -n "$M" ] && { timeout 240 "$M" >"$out/moe_test.txt" 2>&1; echo "== gpu_moe_test: rc $? ($(( $(date +%s) - t0 )) s)"; }
grep -E "PASSED|FAILED|Failure" "$out/moe_test.txt" | head -12
[ -n "$B" ] && { timeout 150 "$B" --t "${M3_MOE_T:-1,8,64,2048}" --fp8 >"$out/bench_moe.txt" 2>&1;
  echo "== bench_moe --fp8: rc $?"; }
sed -n '/Eager breakdown/,$p' "$out/bench_moe.txt" | grep -E "^\| [0-9]|^bf16 vs|^GEMM|^FP8 experts" | head -30
if [ -n "$B" ] && [ "${M3_MOE_NCU_PREFILL:-0}" = 1 ]; then
  timeout 100 ncu --kernel-name regex:moe_wgmma_fp8 --launch-count 2 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis "$B" --t 8192 --fp8 --quick >"$out/ncu_moe_fp8.txt" 2>&1
  echo "== ncu moe_wgmma_fp8 (T 8192): rc $?"
  grep -E "moe_wgmma_fp8|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Compute \(SM\)|Issue Slots|Warp Cycles" \
    "$out/ncu_moe_fp8.txt" | cut -c1-150 | head -24
fi
[ "${M3_MOE_SKIP_ATTN:-0}" = 1 ] && T="" X=""
[ -n "$B" ] && timeout 90 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --kernel-name-base mangled -k regex:moe_gemm_kernelILi16ELi1ELi8ELb1EhE -s 2 -c 1 "$B" --t 8 --fp8 >"$out/ncu_moe.txt" 2>&1
echo "== ncu moe_gemm (T 8): rc $?"
grep -E "moe_gemm_kernel|==PROF==|Duration|DRAM Throughput|Issued Warp|No Eligible|Stall" "$out/ncu_moe.txt" | cut -c1-150 | head -24
[ -n "$T" ] && { timeout 150 "$T" >"$out/prefill_test.txt" 2>&1; echo "== gpu_msa_prefill_tc_test: rc $?"; }
grep -E "PASSED|FAILED|Failure" "$out/prefill_test.txt" 2>/dev/null | head -8
[ -n "$X" ] && { timeout 120 "$X" --attention-only --kv 16384 --kv 65536 --kv 131072 >"$out/prefill_bench.txt" 2>&1;
  echo "== bench_prefill_tc: rc $?"; }
grep -E "KV-block-major|phases|routed" "$out/prefill_bench.txt" 2>/dev/null | grep -v "^{" | cut -c1-160
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
