#!/usr/bin/env bash
# ctest fixture: installs the npm test deps, builds the corpus and the HuggingFace reference outputs
# into OUT_DIR (skipped when OUT_DIR is newer than the scripts that produce it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: prepare_reference.sh OUT_DIR}"
bash "$here/../../scripts/fetch_test_deps.sh"
stamp="$out/.complete"
fresh=1
for f in "$here/build_corpus.js" "$here/reference.js" "$here/prng.js" "$here"/synthetic/*.json; do
  [ -f "$stamp" ] && [ "$stamp" -nt "$f" ] || fresh=0
done
[ "$fresh" = 1 ] && exit 0
rm -rf "$out"
node "$here/build_corpus.js" "$out"
node "$here/reference.js" "$out"
touch "$stamp"
