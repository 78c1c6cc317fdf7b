#!/usr/bin/env bash
# Device side of the FP8-experts check (docs/FP8.md §9; one call, ≈ 60–90 s): binaries built on the CPU machine
# (-DM3_WITH_CUDA=ON, Release, stripped), the FP8 MoE tests, the FP8 decode-graph test, the MXFP8-fixture FP8 model
# tests, bench_moe bf16 vs FP8 experts at M3 widths.
# Run from the session checkout root with carry [".gpuwork/<name>-bin", ".gpudeps"]:
#   bash .gpuwork/<name>-bin/run.sh [path of bin.tar.xz, default next to this script]
# bin.tar.xz: bin/{gpu_moe_test,gpu_graph_test,bench_moe,gpu_model_test}, stripped (the fatbins xz to ≈ 4 MB, so the
# carry stays far below the 64 MiB limit).
set -u
T0=$(date +%s)
root=$(pwd)
. "$root/scripts/gpu_env.sh"
d=/tmp/fp8moe-bin; rm -rf $d; mkdir -p $d; tar -xJf "${1:-$(dirname "$0")/bin.tar.xz}" -C $d
b=$d/bin; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
timeout 90 $b/gpu_moe_test --gtest_filter='GpuMoe.*-GpuMoe.GroupedMoeMatchesCpuReferenceAtM3Widths:GpuMoe.WgmmaAndMmaSyncPathsAgreeAtM3Widths:GpuMoe.WgmmaGemmsMatchCpuReference' >$O/moe.log 2>&1
echo "moe rc=$? t=$(( $(date +%s) - T0 ))"
grep -E "^\[ *(OK|FAILED|PASSED) |fp8|Failure|Expected|Which is" $O/moe.log | cut -c1-260 | head -60
timeout 40 $b/gpu_graph_test --gtest_filter='GpuGraph.Fp8Weights*' >$O/graph.log 2>&1
echo "graph rc=$? t=$(( $(date +%s) - T0 ))"
grep -E "^\[ *(OK|FAILED|PASSED) |gpu-graph|Failure|Expected" $O/graph.log | cut -c1-260 | head -20
timeout 60 $b/bench_moe --t 1,8,64,2048 --fp8 >$O/bench.log 2>&1
echo "bench rc=$? t=$(( $(date +%s) - T0 ))"
tail -32 $O/bench.log
M3_SOURCE_DIR=$root timeout 60 $b/gpu_model_test --gtest_filter='GpuModel.Mxfp8FixtureWithFp8Weights*:GpuModel.EngineGeneratesGreedyTokensWithFp8Weights' >$O/model.log 2>&1
echo "model rc=$? t=$(( $(date +%s) - T0 ))"
grep -E "^\[ *(OK|FAILED|PASSED) |\[gpu-model\].*(fp8|mxfp8)|Failure|Expected" $O/model.log | cut -c1-300 | head -20
