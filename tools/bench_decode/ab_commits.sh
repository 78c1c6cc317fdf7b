#!/usr/bin/env bash
# bench_decode at several commits in one device call (the scorer / attention kernels of each, built side by side
# with each commit's own run_device.sh, then timed one after the other, ROUNDS times interleaved).
#   here:    bash tools/bench_decode/ab_commits.sh prepare C1 C2 …   (git archive of src, tests/gpu, tools into
#            .gpuwork/<commit>/; .gpuwork is ignored, so carry it: run's carry [".gpudeps", ".gpuwork"])
#   device:  bash tools/bench_decode/ab_commits.sh run OUTDIR "C1 C2 … HEAD" [bench_decode args…]
#            (HEAD = the working tree itself; default args --fp8 --index-only --batches 1,8 --ctxs 61440,16384)
# Env: ROUNDS (default 2). First used for the B = 1 scorer bisect of bench/results/2026-12-03d-fp8-moe-wgmma-h200.md.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cmd="${1:-}"; shift || true
if [ "$cmd" = prepare ]; then
  for c in "$@"; do
    rm -rf "$root/.gpuwork/$c" && mkdir -p "$root/.gpuwork/$c"
    git -C "$root" archive "$c" src tests/gpu tools | tar -x -C "$root/.gpuwork/$c"
    echo "prepared .gpuwork/$c"
  done
  exit 0
fi
[ "$cmd" = run ] || { echo "usage: ab_commits.sh prepare C… | run OUTDIR \"C… HEAD\" [bench args]"; exit 2; }
out="$1"; read -r -a names <<<"$2"; shift 2
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(--fp8 --index-only --batches 1,8 --ctxs 61440,16384)
mkdir -p "$out"
for n in "${names[@]}"; do
  src="$root/.gpuwork/$n"; [ "$n" = HEAD ] && src="$root"
  [ "$n" = HEAD ] || ln -sfn "$root/.gpudeps" "$src/.gpudeps"
  M3_BENCH_BUILD_ONLY=1 M3_BENCH_BUILD_DIR="/tmp/bd_$n" bash "$src/tools/bench_decode/run_device.sh" "$out/b_$n" \
    >"$out/build_$n.txt" 2>&1 &
done
wait
for n in "${names[@]}"; do echo "== build $n: $(grep -E '^build' "$out/build_$n.txt" | head -1)"; done
for rep in $(seq 1 "${ROUNDS:-2}"); do
  for n in "${names[@]}"; do
    echo "== $n, round $rep"
    "/tmp/bd_$n/bench_decode" "${args[@]}" 2>&1 | grep -E "^\| " | grep -vE "^\|[- |]*\|$"
  done
done
