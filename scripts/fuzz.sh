#!/usr/bin/env bash
# Builds every tests/fuzz/fuzz_*.cpp as a libFuzzer target (clang-14, ASan + UBSan, coverage on the
# libraries too) in build-fuzz/ and runs each for M3_FUZZ_SECONDS seconds. Exits non-zero if a target
# fails to build, crashes, leaks, hits a sanitizer report or times out.
#
#   scripts/fuzz.sh                      # all targets, 20 s each
#   M3_FUZZ_SECONDS=300 scripts/fuzz.sh fuzz_output_parsers
#
# Env: M3_FUZZ_SECONDS (20), M3_FUZZ_MAX_LEN (4096), M3_FUZZ_JOBS (build jobs, 2),
#      M3_FUZZ_BUILD_DIR (build-fuzz), M3_FUZZ_OUT (where crash artifacts go, build-fuzz/artifacts).
# Per-target inputs (optional): tests/fuzz/corpus/<target>/ seeds (copied, never written back) and
# tests/fuzz/<target>.dict. Corpus growth stays in the build dir across runs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${M3_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SECS=${M3_FUZZ_SECONDS:-20}
MAXLEN=${M3_FUZZ_MAX_LEN:-4096}
JOBS=${M3_FUZZ_JOBS:-2}
OUT=${M3_FUZZ_OUT:-$BUILD/artifacts}

export CC=${CC:-clang-14} CXX=${CXX:-clang++-14}

# Targets: the ones named on the command line, else every fuzz_*.cpp present.
targets=()
if [ $# -gt 0 ]; then
  targets=("$@")
else
  for f in "$ROOT"/tests/fuzz/fuzz_*.cpp; do
    [ -e "$f" ] || continue
    targets+=("$(basename "$f" .cpp)")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no tests/fuzz/fuzz_*.cpp found" >&2
  exit 1
fi

# The sanitizer + coverage flags go on every translation unit so the libraries under test are
# instrumented too; the fuzz executables add -fsanitize=fuzzer themselves (tests/fuzz/CMakeLists.txt).
# UBSan is made fatal so undefined behaviour fails the run instead of just printing.
mkdir -p "$BUILD"
FLAGS="-g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DM3_BUILD_FUZZ=ON -DM3_BUILD_TESTS=OFF \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" >"$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log" >&2
  echo "fuzz.sh: configure failed" >&2
  exit 1
}
mkdir -p "$OUT"
failed=()
for t in "${targets[@]}"; do
  # One target at a time: a target whose libraries do not build under clang fails alone.
  bin="$BUILD/tests/fuzz/$t"
  if ! cmake --build "$BUILD" -j"$JOBS" --target "$t" >"$BUILD/$t.build.log" 2>&1 || [ ! -x "$bin" ]; then
    echo "fuzz.sh: $t FAILED to build (log: $BUILD/$t.build.log)" >&2
    grep -E 'error' "$BUILD/$t.build.log" | head -n 10 >&2 || true
    failed+=("$t")
    continue
  fi
  corpus="$BUILD/corpus/$t"
  mkdir -p "$corpus"
  if [ -d "$ROOT/tests/fuzz/corpus/$t" ]; then
    cp -n "$ROOT/tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  fi
  args=(-max_total_time="$SECS" -max_len="$MAXLEN" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$OUT/$t-")
  [ -f "$ROOT/tests/fuzz/$t.dict" ] && args+=(-dict="$ROOT/tests/fuzz/$t.dict")
  echo "=== $t: ${SECS}s, max_len $MAXLEN"
  log="$BUILD/$t.log"
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     "$bin" "${args[@]}" "$corpus" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE' "$log" || tail -n 3 "$log"
  else
    echo "fuzz.sh: $t FAILED (log: $log, artifacts: $OUT/$t-*)" >&2
    tail -n 40 "$log" >&2
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: failing targets: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: all ${#targets[@]} target(s) ran ${SECS}s without failures"
