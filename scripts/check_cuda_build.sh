#!/usr/bin/env bash
# CI compile check of the CUDA backend (no GPU needed): configures build-cuda-ci with -DM3_WITH_CUDA=ON and builds
# the CUDA targets (backend, executor, gpu tests, bench). Skips with exit 0 when no nvcc is installed.
# gtest discovery runs the gpu test binaries at build time; they list their tests without touching a device.
# Env: M3_CUDA_BUILD_DIR (default build-cuda-ci), M3_JOBS (default: all cores).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nvcc="$(command -v nvcc || true)"
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; }
if [ -z "$nvcc" ]; then
  echo "check_cuda_build: no nvcc found, skipping the CUDA compile check"
  exit 0
fi
build="${M3_CUDA_BUILD_DIR:-$root/build-cuda-ci}"
jobs="${M3_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DM3_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" >/dev/null
cmake --build "$build" -j"$jobs" --target m3_backend_cuda m3_cuda_executor gpu_ops_test gpu_model_test bench_msa m3serve \
  gpu_hopper_test gpu_msa_prefill_tc_test bench_gemm bench_prefill_tc gpu_decode_test bench_decode \
  gpu_moe_test bench_moe gpu_load_test gpu_sampling_test bench_sampling bench_prefill_cases \
  gpu_graph_test gpu_fp8_test gpu_kv_fp8_test gpu_vision_test bench_vision
# The gpu tests must skip cleanly without a device (they also run fine on one).
if ! "$build/tests/gpu/gpu_ops_test" --gtest_brief=1 >/dev/null 2>&1; then
  echo "check_cuda_build: gpu_ops_test failed"; exit 1
fi
echo "check_cuda_build: CUDA targets built with $("$nvcc" --version | tail -1)"
