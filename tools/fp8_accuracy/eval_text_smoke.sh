#!/usr/bin/env bash
# Smoke test of fp8_eval_text (ctest fp8_eval_text_smoke): a random tiny M3 written as bf16 and as MXFP8 from the same
# seed by tools/checkpoint/make_checkpoint.py, scored on the first bytes of README.md
# (2 × 96 bytes: 6 MSA blocks of 16, so some rows rank their blocks). Fails when the tool fails, a
# row is missing, a number is not finite, or the reference does not agree with itself.
#   eval_text_smoke.sh PYTHON3 FP8_EVAL_TEXT_BINARY SOURCE_DIR
set -euo pipefail
py="$1"; bin="$2"; root="$3"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
for t in bf16 mxfp8; do
  "$py" "$root/tools/checkpoint/make_checkpoint.py" --config "$root/tests/golden/configs/tiny_sparse.json" --dtype $t \
    --seed 7 --no-vision-config --out "$d/$t" >/dev/null
done
out=$("$bin" --reference "$d/bf16" --checkpoint "$d/mxfp8" --text "$root/README.md" --seq-len 96 --seqs 2)
echo "$out"
same='\| 100\.00 % \| 100\.00 % \| 0\.00e\+00 / 0\.00e\+00 \|$'  # agreement with itself: all rows, decisive rows, error
grep -qE "^\| bf16; fp32 \(the reference\) \|.*$same" <<<"$out"
grep -qE "^\| bf16 K / V / index-K \|.*$same" <<<"$out"
# four header rows; 7 model rows, 5 KV-cache rows, 3 index-K selection rows, 4 rows split by selection
[ "$(grep -c '^| ' <<<"$out")" -eq 23 ]
grep -qE '^\| fp32 \(reference noise\) \| [0-9.]+ % \| [0-9.]+ % \([1-9][0-9]*\) \|' <<<"$out"  # ranked rows exist
! grep -qiE '\b(nan|inf)\b' <<<"$out"
echo "fp8_eval_text smoke: ok"
