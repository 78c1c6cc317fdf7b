#!/usr/bin/env bash
# One device call for the kernels of 2026-12-02 that were compiled but never run on a GPU (docs/KERNELS.md §9,
# docs/FP8.md §8): the e4m3 K/V / index-K decode kernels and the latest PagedDecodeMq (multi-query decode). Checks
# against the CPU twins first, then the benchmarks; each part under its own timeout, since a barrier deadlock would
# otherwise burn the whole call. Output: logs under $1 (default $OUT) and a summary on stdout.
#   device `run`: carry [".gpudeps"], command `bash scripts/gpu_pending_run.sh $OUT`   (≈ 3–5 minutes)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_pending}}"
mkdir -p "$out"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
# 1. e4m3 checks + bf16 vs e4m3 timing (bench_decode --fp8 runs only the e4m3 checks, then times both caches).
M3_COMMIT="$commit" timeout 200 bash "$root/tools/bench_decode/run_device.sh" "$out/fp8" --fp8 >"$out/fp8.log" 2>&1
echo "== bench_decode --fp8: rc $?"
grep -E "^check|FAIL|fail|accuracy|identical|rel" "$out/fp8.log" | head -30
grep -E "e4m3" "$out/fp8/bench.log" 2>/dev/null | grep -E "B=(8|64) ctx=(16k|64k)" | head -16
# 2. multi-query decode: checks vs the CPU twin and the per-row kernel, then Q = 4 / 8 timing.
M3_COMMIT="$commit" timeout 200 bash "$root/tools/bench_decode/run_device.sh" "$out/mq" --multi-query >"$out/mq.log" 2>&1
echo "== bench_decode --multi-query: rc $?"
grep -E "^check|FAIL|fail" "$out/mq.log" | head -20
grep -E "mq|union|per-row" "$out/mq/bench.log" 2>/dev/null | grep -E "B=(8|32|64)" | head -24
echo "records: $out/fp8/records.json $out/mq/records.json (add them to bench/results/msa_latest.json)"
