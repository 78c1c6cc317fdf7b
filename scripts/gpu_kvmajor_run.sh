#!/usr/bin/env bash
# One device call for the KV-block-major prefill work of 2026-12-02d: build, its gpu tests, the tile-order /
# consumer sweep at the issue-10 shapes, the 128 manifest cases with graph timing and a router-threshold sweep, and
# a short ncu of the attention kernel.
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_kvmajor_run.sh $OUT`   (≈ 4–5 minutes)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_kvmajor}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
M3_TARGETS="bench_prefill_tc bench_prefill_cases gpu_msa_prefill_tc_test" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 \
  M3_SKIP_E2E=1 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
find_bin() { find build-gpu -name "$1" -type f | head -1; }
T=$(find_bin gpu_msa_prefill_tc_test)
X=$(find_bin bench_prefill_tc)
C=$(find_bin bench_prefill_cases)
timeout 150 "$T" >"$out/test.txt" 2>&1
echo "== gpu_msa_prefill_tc_test: rc $?"
grep -E "PASSED|FAILED|differs|Failure" "$out/test.txt" | head -20
timeout 200 "$X" --attention-only --sweep-order --kv 16384 --kv 65536 --kv 131072 >"$out/bench.txt" 2>&1
echo "== bench_prefill_tc: rc $?"
grep -E "KV-block-major|phases|routed|consumers" "$out/bench.txt" | grep -v "^{" | cut -c1-160
timeout 150 "$C" --cases .gpucarry/prefill_cases.txt --reps 7 --thresholds 10,14,18,22,26,34 >"$out/cases.txt" 2>&1
echo "== bench_prefill_cases: rc $?"
sed -n '/Representative-weighted/,$p' "$out/cases.txt"
timeout 60 ncu --section SpeedOfLight --section SchedulerStats -k regex:msa_prefill_kvmajor_kernel -c 1 "$X" \
  --attention-only --kv 16384 >"$out/ncu.txt" 2>&1
grep -E "Duration|Throughput|Issue|Eligible" "$out/ncu.txt" | head
