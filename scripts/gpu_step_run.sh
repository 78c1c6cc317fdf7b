#!/usr/bin/env bash
# One device call for the decode step (2026-12-03): the scorer's e4m3 route through f16 mma (bench_decode checks +
# timings), the gpu tests the default GEMV policy touches, and the 60k-token e2e with the per-interval step profile
# (M3_STEP_PROFILE=2: the largest intervals of the decode graph, so each category's time has a place), bf16 and fp8.
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_step_run.sh $OUT`   (≈ 4 minutes warm)
# Env: M3_COMMIT (recorded), M3_STEP_SKIP_DECODE=1 / M3_STEP_SKIP_TESTS=1 (skip those parts), M3_STEP_TESTS (the gpu
# test binaries), M3_STEP_E2E (below), M3_STEP_DECODE_ARGS (more bench_decode flags, e.g. --trace).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_step}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
c="${M3_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
if [ "${M3_STEP_SKIP_DECODE:-0}" != 1 ]; then
  M3_COMMIT="$c" timeout 120 bash tools/bench_decode/run_device.sh "$out/dec" --fp8 --index-only --batches 8,64 \
    --ctxs 16384,65536 ${M3_STEP_DECODE_ARGS:-} >"$out/dec.txt" 2>&1
  echo "== bench_decode --fp8 --index-only ${M3_STEP_DECODE_ARGS:-}: rc $?"
  grep -E "FAIL|mismatch|^\| msa_decode_index|last CTA" "$out/dec.txt" | head -40
fi
tests="${M3_STEP_TESTS:-gpu_ops_test gpu_decode_test gpu_graph_test gpu_fp8_test gpu_model_test}"
[ "${M3_STEP_SKIP_TESTS:-0}" = 1 ] && tests=""
M3_TARGETS="$tests m3serve" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 M3_SKIP_E2E=1 \
  timeout 300 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
for t in $tests; do
  b=$(find build-gpu -name "$t" -type f | head -1)
  [ -n "$b" ] || { echo "== $t: not built"; continue; }
  timeout 200 "$b" --gtest_brief=1 >"$out/$t.txt" 2>&1
  echo "== $t: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" "$out/$t.txt" | head -5
done
# M3_STEP_E2E: the e2e runs, "dtype[:VAR=value]" each (default: bf16 and fp8 with the default policies).
for v in ${M3_STEP_E2E:-bfloat16 fp8}; do
  d=${v%%:*}; kv=""; [ "$v" != "$d" ] && kv=${v#*:}
  name="$d${kv:+-${kv//=/}}"
  env ${kv:+"$kv"} M3_STEP_PROFILE=2 M3_COMMIT="$c" M3_E2E_DTYPE=$d M3_E2E_M3SERVE="$root/build-gpu/bin/m3serve" \
    M3_E2E_PLAN="msa:long" M3_E2E_LONG=60000 M3_E2E_LONG_OUTPUT=64 M3_E2E_LONG_MIN=30 M3_E2E_BUDGET=60 \
    timeout 90 bash scripts/gpu_e2e_bench.sh "$out/e2e-$name" >"$out/e2e-$name.log" 2>&1
  echo "== e2e 60k $d ${kv:-(defaults)}: rc $?"
  grep -E "Median TTFT|Median TPOT|gpu profile" "$out/e2e-$name.log" | cut -c1-330
  grep -rh "decode step intervals" "$out/e2e-$name" 2>/dev/null | tail -1 | sed 's/.*| in order: /in order: /' | cut -c1-2000
  grep -rh "^warm-up:" "$out/e2e-$name" 2>/dev/null | head -1
  grep -rh "eager prefill steps" "$out/e2e-$name" 2>/dev/null | tail -1 | sed 's/.*(at exit): /eager prefill: /' |
    cut -c1-3000
  rm -rf "$out/e2e-$name/runs"
done
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
