#!/usr/bin/env bash
# The GPU run (issue 5), on the H200 device machine: build the CUDA backend, run every `gpu` test, run the smoke
# benchmark, and write a summary plus logs into the folder given as $1 (default $OUT).
#   bash scripts/gpu_run.sh [OUTDIR]        env: M3_JOBS (16), M3_COMMIT (recorded), M3_SKIP_BENCH=1, M3_SKIP_TESTS=1,
#                                            M3_SKIP_E2E=1, M3_TARGETS="a b" (build only these), M3_CTEST_REGEX (ctest -R)
# The device machine has none of m3serve's C++ dependencies: scripts/gpu_env.sh unpacks the carried .gpudeps/.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-$root/out/gpu}}"
jobs="${M3_JOBS:-16}"
build="$root/build-gpu"
mkdir -p "$out"
summary="$out/summary.md"
: >"$summary"
say() { echo "$@" | tee -a "$summary"; }
t0=$(date +%s)

say "# m3serve GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "commit: ${M3_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}"
{
  echo "## environment"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -1
  cmake --version 2>&1 | head -1
  (. /etc/os-release 2>/dev/null && echo "os: $PRETTY_NAME")
  ldd --version 2>&1 | head -1
  c++ --version 2>&1 | head -1
  nproc
} >"$out/env.txt" 2>&1
grep -E "H200|H100|NVIDIA" "$out/env.txt" | head -2 | sed 's/^/gpu: /' | tee -a "$summary"

# ---- dependencies from .gpudeps/*.deb (scripts/gpu_env.sh) ---------------------------------------------------------
. "$root/scripts/gpu_env.sh"

# ---- build --------------------------------------------------------------------------------------------------------
tb=$(date +%s)
targets=(gpu_ops_test gpu_model_test gpu_hopper_test gpu_msa_prefill_tc_test gpu_decode_test)
[ "${M3_SKIP_BENCH:-0}" = 1 ] || targets+=(bench_msa)
[ -z "${M3_TARGETS:-}" ] || read -r -a targets <<<"$M3_TARGETS"
if cmake -S "$root" -B "$build" -DM3_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release "${cmake_extra[@]}" >"$out/build.log" 2>&1 &&
   cmake --build "$build" -j"$jobs" --target "${targets[@]}" >>"$out/build.log" 2>&1; then
  say "build: ok ($(( $(date +%s) - tb )) s, targets ${targets[*]})"
else
  say "build: FAILED ($(( $(date +%s) - tb )) s) — tail of build.log:"
  grep -E "error|Error|CMake Error" "$out/build.log" | head -30 | tee -a "$summary"
  tail -20 "$out/build.log"
  exit 1
fi

# ---- gpu tests ----------------------------------------------------------------------------------------------------
status=0
if [ "${M3_SKIP_TESTS:-0}" != 1 ]; then
  tt=$(date +%s)
  (cd "$build" && ctest -L gpu ${M3_CTEST_REGEX:+-R "$M3_CTEST_REGEX"} -V --timeout 600) >"$out/ctest.log" 2>&1 || status=1
  say "gpu tests: $( [ $status = 0 ] && echo passed || echo FAILED ) ($(( $(date +%s) - tt )) s)"
  grep -E "tests passed|tests failed" "$out/ctest.log" | tail -1 | tee -a "$summary"
  grep -E "\(Failed\)|\*\*\*Failed|Exception|Timeout" "$out/ctest.log" | head -20 | tee -a "$summary"
  say ""
  say '```'
  grep -hoE "\[gpu-(op|model)\].*" "$out/ctest.log" | tee -a "$summary" >/dev/null
  grep -hE "Failure|Expected|Which is|actual|error:" "$out/ctest.log" | head -40 >>"$summary"
  say '```'
fi

# ---- smoke benchmark ----------------------------------------------------------------------------------------------
if [ "${M3_SKIP_BENCH:-0}" != 1 ]; then
  bb=$(date +%s)
  if "$build/tools/bench_msa/bench_msa" --model "$root/tests/golden/fixtures/tiny_sparse_f32" >"$out/bench.log" 2>&1; then
    say "bench: ok ($(( $(date +%s) - bb )) s)"
  else
    say "bench: FAILED ($(( $(date +%s) - bb )) s)"; status=1
  fi
  say '```'
  grep -E "^\||^$|^device" "$out/bench.log" | cat -s >>"$summary" || tail -20 "$out/bench.log" >>"$summary"
  say '```'
fi
# ---- end to end on the GPU: `m3serve generate` and `m3serve serve` with --device cuda ---------------------------------
if [ "${M3_SKIP_E2E:-0}" != 1 ]; then
  te=$(date +%s)
  if cmake --build "$build" -j"$jobs" --target m3serve >>"$out/build.log" 2>&1; then
    m3="$build/bin/m3serve"
    fx="$root/tests/golden/fixtures/tiny_sparse_f32"
    ids="$(seq -s, 1 200)"
    say '```'
    for dev in cpu cuda; do
      say "generate --device $dev: $("$m3" generate --model "$fx" --prompt-ids "$ids" --max-tokens 24 --device "$dev" 2>>"$out/e2e.log")"
      tail -1 "$out/e2e.log" | tee -a "$summary" >/dev/null
    done
    # serve: a demo model with a real tokenizer (carried in .gpucarry/tokenizer), chat completion over HTTP.
    if [ -f "$root/.gpucarry/tokenizer/tokenizer.json" ]; then
      PYTHON=python3 M3_DEMO_TOKENIZER_DIR="$root/.gpucarry/tokenizer" bash "$root/scripts/make_demo_model.sh" /tmp/m3demo >>"$out/e2e.log" 2>&1
      "$m3" serve --model /tmp/m3demo --served-model-name m3-demo --port 18123 --device cuda >>"$out/serve.log" 2>&1 &
      spid=$!
      for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18123/health >/dev/null 2>&1 && break; sleep 0.5; done
      grep -m1 -iE "kv|cache|pages" "$out/serve.log" | tee -a "$summary" >/dev/null
      body='{"model":"m3-demo","messages":[{"role":"user","content":"Hello from the H200"}],"max_tokens":16,"temperature":0}'
      say "serve --device cuda chat: $(curl -s http://127.0.0.1:18123/v1/chat/completions -H 'Content-Type: application/json' -d "$body" | head -c 600)"
      say "serve --device cuda stream: $(curl -sN http://127.0.0.1:18123/v1/chat/completions -H 'Content-Type: application/json' -d "${body%\}},\"stream\":true}" | tail -c 300)"
      say "metrics: $(curl -s http://127.0.0.1:18123/metrics | grep -E '^m3serve:(kv_pages_used|generation_tokens_total)' | tr '\n' ' ')"
      kill $spid 2>/dev/null; wait $spid 2>/dev/null
    fi
    say '```'
    say "e2e: done ($(( $(date +%s) - te )) s)"
  else
    say "e2e: m3serve build FAILED"; status=1
  fi
fi
say "total: $(( $(date +%s) - t0 )) s"
cat "$summary"
exit $status
