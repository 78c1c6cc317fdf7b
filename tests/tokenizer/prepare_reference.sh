#!/usr/bin/env bash
# ctest fixture: installs the npm test deps, builds the corpus and the HuggingFace reference outputs
# into OUT_DIR (skipped when OUT_DIR is newer than the scripts that produce it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: prepare_reference.sh OUT_DIR}"
bash "$here/../../scripts/fetch_test_deps.sh"
stamp="$out/.complete"
if [ -f "$stamp" ] && [ "$stamp" -nt "$here/build_corpus.js" ] && [ "$stamp" -nt "$here/reference.js" ] \
   && [ "$stamp" -nt "$here/synthetic/spm_like.json" ] && [ "$stamp" -nt "$here/synthetic/meta_like.json" ]; then
  exit 0
fi
rm -rf "$out"
node "$here/build_corpus.js" "$out"
node "$here/reference.js" "$out"
touch "$stamp"
