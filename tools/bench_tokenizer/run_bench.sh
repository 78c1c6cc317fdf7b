#!/usr/bin/env bash
# Side-by-side tokenizer throughput: ours vs HF tokenizers on the exactness corpus.
# Usage: tools/bench_tokenizer/run_bench.sh BUILD_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:?usage: run_bench.sh BUILD_DIR}"
corpus="$build/tokenizer_corpus"
bash "$root/scripts/fetch_test_deps.sh"
[ -f "$corpus/corpus.jsonl" ] || node "$root/tests/tokenizer/build_corpus.js" "$corpus"
npm="$root/tests/npm/node_modules"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "commit: $(git -C "$root" rev-parse --short HEAD)"
"$build/bin/bench_tokenizer" "$corpus" "$npm"
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node "$root/tools/bench_tokenizer/bench_hf.js" "$corpus" "$npm"
