#!/bin/bash
# Interleaved A/B of bench_media builds on a noisy machine: each round runs one call of every variant, so a slow
# minute hits all of them; prints median, min, max and every round's img/s per variant.
# Usage: MODE=jpeg|jpeg-kept|decode tools/bench_media/ab_rounds.sh ROUNDS SECS label=command ...
#   e.g. MODE=jpeg ab_rounds.sh 12 0.5 base=./bench_media_base after=build/tools/bench_media/bench_media \
#        after_avx2="M3_MEDIA_NO_AVX512=1 build/tools/bench_media/bench_media"
set -euo pipefail
N=$1; S=$2; shift 2
declare -A res
for _ in $(seq "$N"); do
  for spec in "$@"; do
    l=${spec%%=*}; c=${spec#*=}
    v=$(eval "$c $S ${MODE:-jpeg}" | awk '{print $3}')
    res[$l]="${res[$l]:-} $v"
  done
done
for spec in "$@"; do
  l=${spec%%=*}
  echo "$l:${res[$l]}" | python3 -c "
import sys, statistics
l, v = sys.stdin.read().split(':'); v = [float(x) for x in v.split()]
print(f'{l}: median {statistics.median(v):.1f}  min {min(v):.1f}  max {max(v):.1f}  n={len(v)}  all={v}')"
done
