#!/usr/bin/env bash
# Standalone build + run of bench_decode on the device machine (no CMake; only fmt's headers from .gpudeps, used
# header-only): checks against the CPU twins, then the benchmark. Logs and records.json go to $1 (default $OUT).
#   bash tools/bench_decode/run_device.sh [OUTDIR] [bench args...]       env: M3_COMMIT (recorded),
#   M3_BENCH_BUILD_ONLY=1 (build, print the binary's path, run nothing: an A/B against another checkout's build
#   times both binaries one after the other, never at once), M3_BENCH_BUILD_DIR (default /tmp/bench_decode_build;
#   a second checkout builds beside the first in its own folder)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-${OUT:-/tmp/bench_decode_out}}"
shift || true
b="${M3_BENCH_BUILD_DIR:-/tmp/bench_decode_build}"
mkdir -p "$out" "$b"
inc=()
deb=$(ls "$root"/.gpudeps/libfmt-dev_*.deb 2>/dev/null | head -1)
if [ -n "$deb" ]; then
  rm -rf "$b/deps" && mkdir -p "$b/deps"
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$deb" "$b/deps"
  else (cd "$b" && rm -rf debx && mkdir debx && cd debx && ar x "$deb" && tar -xf data.tar.* -C "$b/deps"); fi
  inc=(-I "$b/deps/usr/include")
fi
cuda_inc="$(dirname "$(dirname "$(command -v nvcc)")")/include"
nv=(nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -I "$root/src" -I "$root/tests/gpu" -I "$root/tools")
t0=$(date +%s)
"${nv[@]}" -std=c++17 -c "$root/tools/bench_decode/bench_decode.cu" -o "$b/bench.o" 2>"$out/build_bench.log" &
"${nv[@]}" -std=c++17 -Xptxas -v -c "$root/src/backend/cuda/paged_decode_tc.cu" -o "$b/pdt.o" 2>"$out/ptxas.log" &
"${nv[@]}" -std=c++17 -Xptxas -v -c "$root/src/backend/cuda/msa_decode_index.cu" -o "$b/mdi.o" 2>>"$out/ptxas.log" &
"${nv[@]}" -std=c++17 -c "$root/src/backend/cuda/kv_fp8.cu" -o "$b/kvfp8.o" 2>>"$out/build_bench.log" &
"${nv[@]}" -std=c++17 -Xptxas -v -c "$root/src/backend/cuda/paged_decode_mq.cu" -o "$b/pdm.o" 2>>"$out/ptxas.log" &
for f in src/backend/cpu/attention src/backend/cpu/msa_indexer src/base/thread_pool src/backend/cuda/common \
  tests/gpu/decode_tc_checks src/backend/cpu/fp8 src/backend/cpu/gemm src/base/dtype; do
  g++ -O2 -std=c++20 -DFMT_HEADER_ONLY "${inc[@]}" -I "$root/src" -I "$cuda_inc" -c "$root/$f.cpp" \
    -o "$b/$(basename $f).o" 2>>"$out/build_cpp.log" &
done
wait
nvcc -gencode=arch=compute_90a,code=sm_90a "$b"/bench.o "$b"/pdt.o "$b"/mdi.o "$b"/pdm.o "$b"/kvfp8.o "$b"/attention.o \
  "$b"/msa_indexer.o "$b"/thread_pool.o "$b"/common.o "$b"/decode_tc_checks.o "$b"/fp8.o "$b"/gemm.o "$b"/dtype.o \
  -o "$b/bench_decode" -lpthread 2>>"$out/build_bench.log" ||
  { echo "build FAILED"; cat "$out"/build_*.log | grep -E "error" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
grep -E "registers|spill" "$out/ptxas.log" | sed 's/ptxas info *: //' | head -16
[ -n "${M3_BENCH_BUILD_ONLY:-}" ] && { echo "binary: $b/bench_decode"; exit 0; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
"$b/bench_decode" --json "$out/records.json" --commit "${M3_COMMIT:-unknown}" "$@" 2>&1 | tee "$out/bench.log"
