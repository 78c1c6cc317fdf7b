#!/usr/bin/env bash
# One device call for the weight-streaming GEMV (docs/KERNELS.md §13; written 2026-12-02e, never run): build, its
# test, bench_gemv at M3 shapes (cuBLASLt bf16 vs gemv_bf16, W8A16 mma vs gemv_e4m3, T = 1, 2, 4, 8), then the
# 60k-token e2e on the M3 slice with and without M3_GEMV=1, bf16 and FP8 weights (TPOT and the decode step's GEMMs).
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_gemv_run.sh $OUT`   (≈ 5–6 minutes cold)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_gemv}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
M3_TARGETS="gpu_gemv_test bench_gemv m3serve" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 M3_SKIP_E2E=1 \
  timeout 300 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
find_bin() { find build-gpu -name "$1" -type f | head -1; }
G=$(find_bin gpu_gemv_test)
B=$(find_bin bench_gemv)
[ -n "$G" ] && { timeout 120 "$G" >"$out/gemv_test.txt" 2>&1; echo "== gpu_gemv_test: rc $?"; }
grep -E "PASSED|FAILED|Failure|rel [0-9.e+-]+ +\(tol" "$out/gemv_test.txt" | awk '{print}' | tail -6
[ -n "$B" ] && { timeout 150 "$B" >"$out/bench_gemv.txt" 2>&1; echo "== bench_gemv: rc $?"; }
cat "$out/bench_gemv.txt" 2>/dev/null | head -70
c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
for d in bfloat16 fp8; do
  for g in 0 1; do
    M3_GEMV=$g M3_COMMIT="$c" M3_E2E_DTYPE=$d M3_E2E_M3SERVE="$root/build-gpu/bin/m3serve" M3_E2E_PLAN="msa:long" \
      M3_E2E_LONG=60000 M3_E2E_LONG_OUTPUT=64 M3_E2E_LONG_MIN=30 M3_E2E_BUDGET=60 \
      timeout 90 bash scripts/gpu_e2e_bench.sh "$out/e2e-$d-gemv$g" >"$out/e2e-$d-gemv$g.log" 2>&1
    echo "== e2e 60k $d M3_GEMV=$g: rc $?"
    grep -E "Median TTFT|Median TPOT|gpu profile" "$out/e2e-$d-gemv$g.log" | cut -c1-330
    rm -rf "$out/e2e-$d-gemv$g/runs"
  done
done
# The step profile's event nodes sit inside the decode graph: one run without them says what they cost in TPOT.
M3_STEP_PROFILE=0 M3_GEMV=0 M3_COMMIT="$c" M3_E2E_DTYPE=bfloat16 M3_E2E_M3SERVE="$root/build-gpu/bin/m3serve" \
  M3_E2E_PLAN="msa:long" M3_E2E_LONG=60000 M3_E2E_LONG_OUTPUT=64 M3_E2E_LONG_MIN=30 M3_E2E_BUDGET=60 \
  timeout 90 bash scripts/gpu_e2e_bench.sh "$out/e2e-noprof" >"$out/e2e-noprof.log" 2>&1
echo "== e2e 60k bfloat16 M3_GEMV=0, no step profile: rc $?"
grep -E "Median TTFT|Median TPOT" "$out/e2e-noprof.log" | cut -c1-200
rm -rf "$out/e2e-noprof/runs"
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
