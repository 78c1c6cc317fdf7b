#!/usr/bin/env bash
# One device call for what landed on 2026-12-02 (fourth session) without a run on the H200, to run FIRST next
# session: every gpu test at one commit — the FP8 routed experts (W8A16 grouped MoE, templated moe_gemm_kernel, also
# on the bf16 decode path; never run), the 3-consumer KV-block-major kernel inside the executor (its own tests passed
# alone) — then bench_moe bf16 vs FP8 experts and the 60k-token TTFT on the M3 slice with the new prefill kernel.
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_pending_run.sh $OUT`   (≈ 8–9 minutes)
# Output: $1 (default $OUT)/tests (gpu_run.sh summary + ctest log), moe.txt, e2e-bf16/ (gpu_e2e_bench.sh report).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_pending}}"
mkdir -p "$out"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
t0=$(date +%s)
# 1. Build every gpu test, bench_moe and m3serve (16 jobs, ≈ 180 s); run all tests labelled gpu (≈ 260 s).
M3_COMMIT="$commit" M3_SKIP_BENCH=1 M3_SKIP_E2E=1 M3_TARGETS="gpu_ops_test gpu_model_test gpu_hopper_test \
gpu_msa_prefill_tc_test gpu_decode_test gpu_moe_test gpu_load_test gpu_sampling_test gpu_graph_test gpu_fp8_test \
gpu_kv_fp8_test gpu_vision_test bench_moe m3serve" timeout 480 bash "$root/scripts/gpu_run.sh" "$out/tests" \
  >"$out/tests.log" 2>&1
echo "== gpu tests: rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^build:|^gpu tests:|tests passed|tests failed|Failed|Timeout" "$out/tests/summary.md" | head -20
grep -E "\(Failed\)|\*\*\*Failed|Timeout" "$out/tests/ctest.log" 2>/dev/null | head -10
# 2. The grouped MoE at M3 widths, bf16 vs FP8 experts (GB/s on the unique expert bytes, copy ceiling beside).
B=$(find "$root/build-gpu" -name bench_moe -type f | head -1)
[ -n "$B" ] && timeout 60 "$B" --t 1,8,64,2048 --fp8 >"$out/moe.txt" 2>&1
echo "== bench_moe --fp8: rc $?"
tail -20 "$out/moe.txt" 2>/dev/null
# 3. 60k-token TTFT, bf16 K/V, one server.
M3_COMMIT="$commit" M3_E2E_M3SERVE="$root/build-gpu/bin/m3serve" M3_E2E_PLAN="msa:long" M3_E2E_LONG=60000 \
  M3_E2E_LONG_OUTPUT=32 M3_E2E_LONG_MIN=30 M3_E2E_BUDGET=60 \
  timeout 90 bash "$root/scripts/gpu_e2e_bench.sh" "$out/e2e-bf16" >"$out/e2e-bf16.log" 2>&1
echo "== e2e 60k, bf16 K/V: rc $?"
grep -E "Median TTFT|Median TPOT|gpu profile" "$out/e2e-bf16.log" | head -4
rm -f "$out"/e2e-bf16/runs/*/requests.jsonl
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
