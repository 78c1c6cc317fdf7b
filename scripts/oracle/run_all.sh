#!/bin/bash
# Regenerates every golden of tests/golden/fixtures into STAGE (default /tmp/golden_stage).
# Run from anywhere on a machine with torch + transformers (minimax_m3_vl); see docs/ORACLE.md.
# Copy STAGE/<name>/{golden.safetensors,provenance.json} into tests/golden/fixtures/<name>/ and
# STAGE/tiny_hf_layout/* into tests/golden/fixtures/tiny_hf_layout/ afterwards.
set -u
cd "$(dirname "$0")/../.."
STAGE=${1:-/tmp/golden_stage}
PY=${PYTHON:-python3}
FIX=tests/golden/fixtures
export PYTHONUNBUFFERED=1
mkdir -p "$STAGE"
rc=0
for name in tiny_sparse_f32 tiny_sparse_mxfp8; do
  echo "=== $name"
  $PY scripts/oracle/make_golden.py --model $FIX/$name --out "$STAGE/$name" --name $name \
      --ids-seed 1234 --T 448 --seed 1 || rc=1
done
echo "=== mxfp8 encoder check"
$PY scripts/oracle/make_golden.py --check-mxfp8 $FIX/tiny_sparse_f32 $FIX/tiny_sparse_mxfp8 \
    --out "$STAGE/mxfp8_check.json" || rc=1
echo "=== tiny_hf_layout"
$PY scripts/oracle/make_golden.py --hf-init tests/golden/configs/tiny_hf_layout.hf.json \
    --save "$STAGE/tiny_hf_layout" --name tiny_hf_layout --ids-seed 1234 --T 448 --seed 7 || rc=1
exit $rc
