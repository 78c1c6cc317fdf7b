#!/usr/bin/env bash
# One device call for what landed on 2026-12-03 (fifth session) without a run on the H200, to run FIRST next session:
# the FP8 MoE N = 256 wgmma kernels (MoeGemmPath::Wgmma256; gpu_moe_test's Fp8Wide* tests, never run) and their
# bench_moe column at prefill sizes, gpu_msa_prefill_tc_test (the union-only plan test's fixed data), and the e4m3
# decode attention at B = 64 under both schedules (the balanced one never timed since the f16 route).
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_pending_run.sh $OUT`   (≈ 5–6 minutes)
# Then, in a second call: `bash scripts/gpu_media_run.sh $OUT/media` (issue 12 on the H200 host).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_pending}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
t0=$(date +%s)
M3_COMMIT="$commit" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 M3_SKIP_E2E=1 \
  M3_TARGETS="gpu_moe_test gpu_msa_prefill_tc_test bench_moe" timeout 240 bash scripts/gpu_run.sh "$out/build" \
  >/dev/null 2>&1
tail -1 "$out/build/summary.md"
find_bin() { find build-gpu -name "$1" -type f | head -1; }
for t in gpu_moe_test gpu_msa_prefill_tc_test; do
  b=$(find_bin "$t")
  [ -n "$b" ] || { echo "== $t: not built"; continue; }
  timeout 200 "$b" --gtest_brief=1 >"$out/$t.txt" 2>&1
  echo "== $t: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|N=256|N256" "$out/$t.txt" | cut -c1-260 | head -12
done
B=$(find_bin bench_moe)
[ -n "$B" ] && { timeout 150 "$B" --t 512,2048,8192 --fp8 >"$out/bench_moe.txt" 2>&1; echo "== bench_moe --fp8: rc $?"; }
sed -n '/both GEMM paths forced/,/^$/p;/bf16 vs FP8 experts/,/^$/p' "$out/bench_moe.txt" 2>/dev/null | head -24
M3_COMMIT="$commit" timeout 150 bash tools/bench_decode/run_device.sh "$out/dec" --fp8 --attn-only --batches 32,64 \
  --ctxs 16384 --schedules 1,2 >"$out/dec.txt" 2>&1
echo "== bench_decode e4m3 attention, cluster vs balanced: rc $?"
grep -E "FAIL|^\| paged" "$out/dec.txt" | head -20
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
