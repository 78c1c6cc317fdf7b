#!/usr/bin/env bash
# Device run for the Hopper toolkit work (issue 10): the wgmma GEMM and tensor-core MSA prefill tests and benches,
# in one call. Uses prebuilt binaries from $M3_HOPPER_BIN (built on the dev machine) when they start,
# else builds the targets here with CMake and the unpacked .gpudeps (as scripts/gpu_run.sh does).
#   bash scripts/gpu_hopper_run.sh [OUTDIR]     env: M3_HOPPER_BIN (dir with the 4 binaries below),
#                                               M3_BENCH_ARGS (extra bench_gemm args), M3_ATTN_ARGS (bench_prefill_tc), M3_NCU=1 (ncu of the prefill kernel)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-$root/out/gpu}}"
mkdir -p "$out"
deps=/tmp/m3-gpudeps
if ls "$root"/.gpudeps/*.deb >/dev/null 2>&1; then
  rm -rf "$deps" && mkdir -p "$deps"
  for f in "$root"/.gpudeps/*.deb; do dpkg-deb -x "$f" "$deps" 2>/dev/null || true; done
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/env.txt"
bin="${M3_HOPPER_BIN:-}"
if [ -z "$bin" ] || ! "$bin/gpu_hopper_test" --gtest_list_tests >/dev/null 2>&1; then
  echo "prebuilt binaries unusable; building here"
  export PKG_CONFIG_PATH="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
  find "$deps" -name '*.pc' -exec sed -i "s|=/usr|=$deps/usr|g; s|-I/usr/|-I$deps/usr/|g; s|-L/usr/|-L$deps/usr/|g" {} +
  extra=(-DCMAKE_PREFIX_PATH="$deps/usr")
  command -v pkg-config >/dev/null || extra+=(-DPKG_CONFIG_EXECUTABLE="$deps/usr/bin/pkgconf")
  b="$root/build-gpu"
  cmake -S "$root" -B "$b" -DM3_WITH_CUDA=ON -DM3_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release "${extra[@]}" >"$out/build.log" 2>&1 &&
    cmake --build "$b" -j16 --target gpu_hopper_test gpu_msa_prefill_tc_test bench_gemm bench_prefill_tc >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  bin="$b/bin"
  [ -x "$bin/gpu_hopper_test" ] || bin="$(dirname "$(find "$b" -name gpu_hopper_test -type f | head -1)")"
  bench="$(find "$b" -name bench_gemm -type f | head -1)"
  bench_attn="$(find "$b" -name bench_prefill_tc -type f | head -1)"
  tdir="$(dirname "$(find "$b" -name gpu_msa_prefill_tc_test -type f | head -1)")"
else
  bench="$bin/bench_gemm"
  bench_attn="$bin/bench_prefill_tc"
  tdir="$bin"
fi
for f in "$bench" "$bench_attn"; do cuobjdump --dump-sass "$f" 2>/dev/null; done | grep -oE "HGMMA\.[A-Z0-9x.]+|UTMALDG[.A-Z0-9]*|USETMAXREG[.A-Z0-9]*" | sort | uniq -c >"$out/sass.txt"
cat "$out/sass.txt"
for t in gpu_hopper_test gpu_msa_prefill_tc_test; do
  timeout "${M3_TEST_TIMEOUT:-60}" "$tdir/$t" 2>&1 | tee -a "$out/test.log" | grep -E "\[gpu-op\]|OK \]|FAILED|PASSED|Failure|Expected|actual" | head -40
done
timeout 60 "$bench" ${M3_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
timeout "${M3_ATTN_TIMEOUT:-90}" "$bench_attn" ${M3_ATTN_ARGS:-} 2>&1 | tee "$out/bench_attn.log"
if [ "${M3_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout 120 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
    -k regex:msa_prefill_union -c 1 "$bench_attn" --kv 65536 >"$out/ncu.txt" 2>&1
  grep -E "Duration|Throughput|Pipe|SM Busy|Issue" "$out/ncu.txt" | head -20
fi
