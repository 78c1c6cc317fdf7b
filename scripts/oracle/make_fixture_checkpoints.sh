#!/bin/bash
# Writes the random checkpoints of the committed golden fixtures (numpy only; runs anywhere).
# The goldens themselves come from scripts/oracle/run_all.sh on a machine with transformers.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
FIX=tests/golden/fixtures
CFG=tests/golden/configs/tiny_sparse.json
$PY tools/checkpoint/make_checkpoint.py --config $CFG --dtype f32 --seed 1 --out $FIX/tiny_sparse_f32
# Same seed: the MXFP8 fixture is the f32 model quantised (embed/lm_head/norms bf16, router gate + bias f32).
$PY tools/checkpoint/make_checkpoint.py --config $CFG --dtype mxfp8 --base-dtype bf16 --seed 1 --out $FIX/tiny_sparse_mxfp8
