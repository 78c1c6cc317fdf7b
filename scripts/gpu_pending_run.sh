#!/usr/bin/env bash
# One device call for what landed on 2026-12-02 (afternoon) without a full run on the H200: every gpu test at one
# commit (the wgmma MoE path, --kv-cache-dtype fp8 in the executor, the CUDA vision tower, the decode changes were
# each tested alone), then the 60k-token TTFT on the M3 slice with bf16 and with fp8 K/V caches, which now includes
# the wgmma MoE GEMMs (bench/results/2026-12-02c-moe-wgmma-h200.md estimates ≈ 180 ms less than 1178 ms).
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_pending_run.sh $OUT`   (≈ 6–8 minutes)
# Output: $1 (default $OUT)/tests (gpu_run.sh summary + ctest log), e2e-bf16/, e2e-fp8/ (gpu_e2e_bench.sh reports).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_pending}}"
mkdir -p "$out"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
t0=$(date +%s)
# 1. Build every gpu test and m3serve (16 jobs), run all tests labelled gpu.
M3_COMMIT="$commit" M3_SKIP_BENCH=1 M3_SKIP_E2E=1 M3_TARGETS="gpu_ops_test gpu_model_test gpu_hopper_test \
gpu_msa_prefill_tc_test gpu_decode_test gpu_moe_test gpu_load_test gpu_sampling_test gpu_graph_test gpu_fp8_test \
gpu_kv_fp8_test gpu_vision_test m3serve" timeout 480 bash "$root/scripts/gpu_run.sh" "$out/tests" >"$out/tests.log" 2>&1
echo "== gpu tests: rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^build:|^gpu tests:|tests passed|tests failed|Failed|Timeout" "$out/tests/summary.md" | head -20
# 2. 60k-token TTFT, bf16 then fp8 K/V (same m3serve; one server per run).
m3="$root/build-gpu/bin/m3serve"
for kv in bf16 fp8; do
  extra=""
  [ "$kv" = fp8 ] && extra="--kv-cache-dtype fp8"
  M3_COMMIT="$commit" M3_E2E_M3SERVE="$m3" M3_E2E_PLAN="msa:long" M3_E2E_LONG=60000 M3_E2E_LONG_OUTPUT=32 \
    M3_E2E_LONG_MIN=30 M3_E2E_BUDGET=90 M3_E2E_EXTRA_SERVE_ARGS="$extra" \
    timeout 120 bash "$root/scripts/gpu_e2e_bench.sh" "$out/e2e-$kv" >"$out/e2e-$kv.log" 2>&1
  echo "== e2e 60k, $kv K/V: rc $?"
  grep -E "Median TTFT|Median TPOT|KV cache|gpu profile" "$out/e2e-$kv.log" | head -6
  rm -f "$out"/e2e-"$kv"/runs/*/requests.jsonl
done
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
