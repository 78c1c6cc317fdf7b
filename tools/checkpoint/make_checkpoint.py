#!/usr/bin/env python3
"""Write a random MiniMax-M3 checkpoint (config.json + safetensors) for tests and benchmarks.

numpy only. The tensor names, dtypes and config layout follow the released VL checkpoint
(docs/M3_MODEL.md §2, §4), so our C++ loader reads these exactly like a real
release.

Examples
  make_checkpoint.py --preset tiny --dtype f32 --out /tmp/tiny
  make_checkpoint.py --config tests/golden/configs/tiny_sparse.json --dtype mxfp8 --out /tmp/tiny8
  make_checkpoint.py --preset m3-4layer --dtype bf16 --shard-mb 2000 --out /tmp/m3w

Determinism: every tensor is drawn from its own generator seeded by (--seed, tensor name), in
fixed row chunks that depend only on the tensor shape. So the f32, bf16 and mxfp8 variants of the
same config and seed hold the *same* underlying random model (bf16/mxfp8 are roundings of it),
and tensors are produced one at a time (bounded memory at real M3 widths).

Initialisation (chosen so a 448-token forward stays O(1) and exercises every branch):
  embed_tokens      N(0, 1)
  projections       N(0, 1/fan_in)            (q/k/v/o, index q/k, down projections, lm_head)
  gate/up (MLP, experts, shared)  N(0, (2.5)^2/fan_in)  -> |g|,|u| > 7 for ~0.5% of values, so
                                               the SwiGLU-OAI clamps are exercised
  router gate       N(0, (2.0)^2/fan_in), fp32 -> sigmoid scores spread over (0, 1)
  e_score_correction_bias  N(0, 0.05^2), fp32 -> non-zero, flips some expert choices
  all RMSNorm weights      N(0, 0.1^2)        -> (1 + w) Gemma norms with non-trivial w
"""

import argparse
import copy
import hashlib
import json
import math
import os
import sys

import numpy as np

# ----------------------------------------------------------------------------------------------
# Presets (released VL layout). "tiny" is exactly tests/golden/configs/tiny_sparse.json.
# ----------------------------------------------------------------------------------------------


def _sparse_cfg(freq, heads, dim, block, topk):
    return {
        "use_sparse_attention": True,
        "sparse_attention_freq": list(freq),
        "sparse_num_index_heads": heads,
        "sparse_index_dim": dim,
        "sparse_block_size": block,
        "sparse_topk_blocks": topk,
        "sparse_score_type": "max",
        "sparse_init_block": 0,
        "sparse_local_block": 1,
        "sparse_disable_index_value": list(freq),
    }


def _text_cfg(hidden, layers, heads, kv_heads, head_dim, vocab, dense_inter, moe_inter, shared_inter,
              experts, topk_experts, dense_layers, sparse_layers, index_heads, index_dim, block, topk_blocks,
              rope_theta, max_pos):
    moe_freq = [0 if i < dense_layers else 1 for i in range(layers)]
    sparse_freq = [0 if i < sparse_layers else 1 for i in range(layers)]
    return {
        "model_type": "minimax_m3_vl_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6,
        "use_gemma_norm": True,
        "use_qk_norm": True,
        "qk_norm_type": "per_head",
        "attention_output_gate": False,
        "rope_theta": rope_theta,
        "rotary_dim": head_dim // 2,
        "partial_rotary_factor": 0.5,
        "hidden_act": "swigluoai",
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "dense_intermediate_size": dense_inter,
        "intermediate_size": moe_inter,
        "shared_intermediate_size": shared_inter,
        "n_shared_experts": 1,
        "num_local_experts": experts,
        "num_experts_per_tok": topk_experts,
        "scoring_func": "sigmoid",
        "use_routing_bias": True,
        "routed_scaling_factor": 2.0,
        "moe_layer_freq": moe_freq,
        "bos_token_id": 200034 if vocab > 200034 else None,
        "eos_token_id": 200020 if vocab > 200020 else None,
        "sparse_attention_config": _sparse_cfg(sparse_freq, index_heads, index_dim, block, topk_blocks),
    }


# A tiny vision tower: present so the config is a complete VL config; the oracle does not run it.
TINY_VISION = {
    "model_type": "clip_vision_model",
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_channels": 3,
    "image_size": 224,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}


def _vl(text, vision, projector_hidden):
    return {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "image_token_index": 200025,
        "video_token_index": 200026,
        "projector_hidden_size": projector_hidden,
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": True,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
        "num_reward_heads": 0,
        "torch_dtype": "float32",
        "text_config": text,
        "vision_config": vision,
    }


def preset(name):
    if name == "tiny":
        # The golden-fixture shape (tests/golden/configs/tiny_sparse.json).
        t = _text_cfg(hidden=128, layers=5, heads=8, kv_heads=2, head_dim=32, vocab=1024, dense_inter=192,
                      moe_inter=64, shared_inter=64, experts=8, topk_experts=2, dense_layers=3, sparse_layers=3,
                      index_heads=2, index_dim=32, block=16, topk_blocks=4, rope_theta=10000.0, max_pos=4096)
        return _vl(t, dict(TINY_VISION), 64)
    if name.startswith("m3-"):
        # Real M3 widths, fewer layers/experts, for GPU benchmarks. m3-1layer: one MSA+MoE layer;
        # m3-4layer: 3 dense + 1 MSA+MoE; m3-4layer-sparse: 4 MSA+MoE layers.
        layers, dense = {"m3-1layer": (1, 0), "m3-4layer": (4, 3), "m3-4layer-sparse": (4, 0)}.get(name, (None, None))
        if layers is None:
            raise SystemExit(f"unknown preset {name}")
        t = _text_cfg(hidden=6144, layers=layers, heads=64, kv_heads=4, head_dim=128, vocab=200064,
                      dense_inter=12288, moe_inter=3072, shared_inter=3072, experts=8, topk_experts=4,
                      dense_layers=dense, sparse_layers=dense, index_heads=4, index_dim=128, block=128,
                      topk_blocks=16, rope_theta=5000000.0, max_pos=1048576)
        return _vl(t, None, 6144)
    raise SystemExit(f"unknown preset {name}")


PRESETS = ["tiny", "m3-1layer", "m3-4layer", "m3-4layer-sparse"]

# ----------------------------------------------------------------------------------------------
# Numeric formats
# ----------------------------------------------------------------------------------------------


def f32_to_bf16_bits(x):
    """Round-to-nearest-even f32 -> bf16, returned as uint16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (u >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _e4m3_positive_table():
    """Values of E4M3 (fn variant: bias 7, no inf, 0x7F = NaN) codes 0..126, increasing."""
    vals = np.zeros(127, dtype=np.float64)
    for code in range(127):
        e, m = code >> 3, code & 7
        vals[code] = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return vals


E4M3_POS = _e4m3_positive_table()  # E4M3_POS[126] == 448
E4M3_MAX = 448.0


def f32_to_e4m3_bits(x):
    """Round-to-nearest-even encode to E4M3 codes (uint8). |x| must be <= 448 (the caller scales).

    Integer arithmetic on the f32 bit pattern (fast on big tensors): normals round by adding half an
    E4M3 ulp minus one plus the kept LSB (ties to even); values below 2^-6 are rounded by an f32 addition
    of 2^14, whose ulp is the E4M3 subnormal step 2^-9. The sign is kept (-0 = 0x80).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    sign = ((u >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    mag = u & np.uint32(0x7FFFFFFF)
    if mag.size and mag.max() > np.uint32(0x43E00000):  # 448.0
        raise ValueError("value out of E4M3 range after scaling")
    normal = mag >= np.uint32(121 << 23)  # >= 2^-6
    odd = (mag >> np.uint32(20)) & np.uint32(1)
    rn = (mag - np.uint32(120 << 23) + np.uint32(0x7FFFF) + odd) >> np.uint32(20)
    sub_f = mag.view(np.float32) + np.float32(16384.0)
    rs = sub_f.view(np.uint32) - np.uint32(141 << 23)
    code = np.where(normal, rn, rs).astype(np.uint8)
    return code | sign


def e4m3_bits_to_f32(b):
    b = b.astype(np.uint8)
    mag = E4M3_POS[np.minimum(b & np.uint8(0x7F), 126)]
    out = np.where(b & np.uint8(0x80), -mag, mag)
    out = np.where((b & np.uint8(0x7F)) == 0x7F, np.nan, out)
    return out.astype(np.float32)


def mxfp8_quantize(w):
    """w [rows, cols] f32, cols % 32 == 0 -> (codes uint8 [rows, cols], scales uint8 [rows, cols/32]).

    Dequant: W = e4m3(code) * 2^(scale - 127). The exponent of each 32-block is the smallest one that
    puts the block's absmax inside E4M3's +-448 range.
    """
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1).astype(np.float64)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(np.where(amax > 0, amax, 1.0) / E4M3_MAX))
    e = np.clip(e, -127, 127)
    # Guard against log2 rounding: make sure amax / 2^e <= 448.
    e = np.where(amax / np.exp2(e) > E4M3_MAX, e + 1, e)
    scaled = blocks * np.exp2(-e).astype(np.float32)[..., None]  # exact: power-of-two scaling
    codes = f32_to_e4m3_bits(scaled).reshape(rows, cols)
    return codes, (e + 127).astype(np.uint8)


def mxfp8_dequantize(codes, scales):
    rows, cols = codes.shape
    v = e4m3_bits_to_f32(codes).reshape(rows, cols // 32, 32)
    return (v * np.exp2(scales.astype(np.float32) - 127.0)[..., None]).reshape(rows, cols).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Tensor plan
# ----------------------------------------------------------------------------------------------

# kind -> how the random values are drawn (see module docstring)
#   "embed": N(0,1); "proj": N(0,1/fan_in); "gateup": N(0,2.5^2/fan_in); "router": N(0,2^2/fan_in)
#   "norm": N(0,0.01); "bias": N(0,0.0025)


class Spec:
    def __init__(self, name, shape, kind, quantizable):
        self.name, self.shape, self.kind, self.quantizable = name, tuple(shape), kind, quantizable


def text_tensor_specs(tc, prefix="language_model."):
    """All text-model tensors of the released layout, in layer order."""
    H = tc["hidden_size"]
    L = tc["num_hidden_layers"]
    nq, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    V = tc["vocab_size"]
    sc = tc.get("sparse_attention_config") or {}
    sfreq = sc.get("sparse_attention_freq") or [0] * L
    if not sc.get("use_sparse_attention", True):
        sfreq = [0] * L
    mfreq = tc.get("moe_layer_freq") or [0] * L
    ih, idim = sc.get("sparse_num_index_heads", 0), sc.get("sparse_index_dim", 0)
    E = tc["num_local_experts"]
    I = tc["intermediate_size"]
    SI = tc["shared_intermediate_size"] * tc.get("n_shared_experts", 1)
    DI = tc["dense_intermediate_size"]
    m = prefix + "model."
    specs = [Spec(m + "embed_tokens.weight", (V, H), "embed", False)]
    for l in range(L):
        p = f"{m}layers.{l}."
        specs += [
            Spec(p + "input_layernorm.weight", (H,), "norm", False),
            Spec(p + "post_attention_layernorm.weight", (H,), "norm", False),
            Spec(p + "self_attn.q_proj.weight", (nq * hd, H), "proj", True),
            Spec(p + "self_attn.k_proj.weight", (nkv * hd, H), "proj", True),
            Spec(p + "self_attn.v_proj.weight", (nkv * hd, H), "proj", True),
            Spec(p + "self_attn.o_proj.weight", (H, nq * hd), "proj", True),
            Spec(p + "self_attn.q_norm.weight", (hd,), "norm", False),
            Spec(p + "self_attn.k_norm.weight", (hd,), "norm", False),
        ]
        if sfreq[l]:
            specs += [
                Spec(p + "self_attn.index_q_proj.weight", (ih * idim, H), "proj", True),
                Spec(p + "self_attn.index_k_proj.weight", (idim, H), "proj", True),
                Spec(p + "self_attn.index_q_norm.weight", (idim,), "norm", False),
                Spec(p + "self_attn.index_k_norm.weight", (idim,), "norm", False),
            ]
        if mfreq[l]:
            b = p + "block_sparse_moe."
            specs += [Spec(b + "gate.weight", (E, H), "router", False),
                      Spec(b + "e_score_correction_bias", (E,), "bias", False)]
            for e in range(E):
                specs += [Spec(f"{b}experts.{e}.w1.weight", (I, H), "gateup", True),
                          Spec(f"{b}experts.{e}.w2.weight", (H, I), "proj", True),
                          Spec(f"{b}experts.{e}.w3.weight", (I, H), "gateup", True)]
            specs += [Spec(b + "shared_experts.gate_proj.weight", (SI, H), "gateup", True),
                      Spec(b + "shared_experts.up_proj.weight", (SI, H), "gateup", True),
                      Spec(b + "shared_experts.down_proj.weight", (H, SI), "proj", True)]
        else:
            specs += [Spec(p + "mlp.gate_proj.weight", (DI, H), "gateup", True),
                      Spec(p + "mlp.up_proj.weight", (DI, H), "gateup", True),
                      Spec(p + "mlp.down_proj.weight", (H, DI), "proj", True)]
    specs += [Spec(m + "norm.weight", (H,), "norm", False),
              Spec(prefix + "lm_head.weight", (V, H), "proj", False)]
    return specs


def vision_tensor_specs(cfg):
    """The vision tower, projector and merge MLP in the released names (docs/M3_MODEL.md §4)."""
    vc, tc = cfg["vision_config"], cfg["text_config"]
    D, I, L = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"]
    C, T, P = vc.get("num_channels", 3), vc.get("temporal_patch_size", 2), vc["patch_size"]
    M = vc.get("spatial_merge_size", 2)
    PH, H = cfg["projector_hidden_size"], tc["hidden_size"]
    v = "vision_tower.vision_model."
    specs = [Spec(v + "embeddings.patch_embedding.weight", (D, C, T, P, P), "patch", False),
             Spec(v + "pre_layrnorm.weight", (D,), "lnw", False), Spec(v + "pre_layrnorm.bias", (D,), "vbias", False)]

    def linear(name, n_out, n_in):
        return [Spec(name + ".weight", (n_out, n_in), "proj", False), Spec(name + ".bias", (n_out,), "vbias", False)]

    for l in range(L):
        p = f"{v}encoder.layers.{l}."
        for n in ("layer_norm1", "layer_norm2"):
            specs += [Spec(p + n + ".weight", (D,), "lnw", False), Spec(p + n + ".bias", (D,), "vbias", False)]
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            specs += linear(p + "self_attn." + n, D, D)
        specs += linear(p + "mlp.fc1", I, D) + linear(p + "mlp.fc2", D, I)
    specs += linear("multi_modal_projector.linear_1", PH, D) + linear("multi_modal_projector.linear_2", H, PH)
    specs += linear("patch_merge_mlp.linear_1", PH, M * M * H) + linear("patch_merge_mlp.linear_2", H, PH)
    return specs


def _std(spec):
    fan_in = int(np.prod(spec.shape[1:])) if spec.kind == "patch" else spec.shape[-1]
    return {"embed": 1.0, "proj": 1.0 / math.sqrt(fan_in), "gateup": 2.5 / math.sqrt(fan_in),
            "router": 2.0 / math.sqrt(fan_in), "norm": 0.1, "bias": 0.05, "patch": 1.0 / math.sqrt(fan_in),
            "lnw": 0.2, "vbias": 0.1}[spec.kind]


CHUNK_ELEMS = 1 << 24  # rows are drawn in chunks of <= 16M values (bounded memory at real widths)


def _rows_per_chunk(shape):
    row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return max(1, CHUNK_ELEMS // max(row, 1))


def generate_chunks(spec, seed):
    """Yield (row_start, f32 array) chunks of the tensor's values; deterministic in (seed, name)."""
    digest = hashlib.sha256(spec.name.encode()).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    std = np.float32(_std(spec))
    if len(spec.shape) == 1:
        # LayerNorm weights (vision) are 1-centred; everything else 0-centred.
        yield 0, rng.standard_normal(spec.shape, dtype=np.float32) * std + np.float32(spec.kind == "lnw")
        return
    rows = spec.shape[0]
    step = _rows_per_chunk(spec.shape)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        yield r0, rng.standard_normal((n,) + spec.shape[1:], dtype=np.float32) * std


# ----------------------------------------------------------------------------------------------
# safetensors writer (our own; header = 8-byte little-endian length + JSON, sorted keys)
# ----------------------------------------------------------------------------------------------

ST_DTYPE_SIZE = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "U8": 1, "I32": 4, "F16": 2, "I64": 8}


class OutTensor:
    """One tensor of the output file: name, safetensors dtype, shape, and a chunk producer."""

    def __init__(self, name, dtype, shape, produce):
        self.name, self.dtype, self.shape, self.produce = name, dtype, tuple(shape), produce

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * ST_DTYPE_SIZE[self.dtype]


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of OutTensor; data written in sorted-name order, one tensor at a time."""
    tensors = sorted(tensors, key=lambda t: t.name)
    header = {}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for t in tensors:
            written = 0
            for arr in t.produce():
                b = np.ascontiguousarray(arr).tobytes()
                f.write(b)
                written += len(b)
            if written != t.nbytes:
                raise RuntimeError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
    return off


def read_safetensors(path):
    """Minimal reader (numpy arrays; BF16 -> uint16 bits, F8_E4M3 -> uint8 codes) for self-checks."""
    np_dt = {"F32": np.float32, "BF16": np.uint16, "F8_E4M3": np.uint8, "U8": np.uint8, "I32": np.int32,
             "F16": np.float16, "I64": np.int64}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
    meta = header.pop("__metadata__", None)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        out[name] = (h["dtype"], np.frombuffer(mm[base + a:base + b], dtype=np_dt[h["dtype"]]).reshape(h["shape"]))
    return out, meta


# ----------------------------------------------------------------------------------------------
# Checkpoint assembly
# ----------------------------------------------------------------------------------------------


def build_out_tensors(specs, dtype, seed, base_dtype):
    """Map the model specs to file tensors for the requested storage dtype."""
    outs = []
    for s in specs:
        def chunks(s=s):
            return generate_chunks(s, seed)

        # router gate + correction bias and the vision patch embedding stay fp32 (as released)
        f32_kind = s.kind in ("router", "bias", "patch")
        if dtype == "f32" or (f32_kind and dtype in ("bf16", "mxfp8")):
            outs.append(OutTensor(s.name, "F32", s.shape, lambda c=chunks: (a for _, a in c())))
        elif dtype == "bf16" or (dtype == "mxfp8" and not (s.quantizable and len(s.shape) == 2)):
            store = "BF16" if dtype == "bf16" or base_dtype == "bf16" else "F32"
            if store == "BF16":
                outs.append(OutTensor(s.name, "BF16", s.shape, lambda c=chunks: (f32_to_bf16_bits(a) for _, a in c())))
            else:
                outs.append(OutTensor(s.name, "F32", s.shape, lambda c=chunks: (a for _, a in c())))
        elif dtype == "mxfp8":
            if s.shape[1] % 32:
                raise SystemExit(f"{s.name}: input width {s.shape[1]} is not a multiple of 32 (MXFP8)")
            # Codes and scales come from the same chunks; quantise each chunk twice (cheap) rather
            # than holding the tensor in memory.
            # Sorted names put "X.weight_scale_inv" right after "X.weight": the codes pass keeps the scales
            # (1/32 of the size) so they need not be quantised again.
            cache = {}

            def codes(c=chunks, cache=cache):
                cache["scales"] = []
                for _, a in c():
                    q, sc = mxfp8_quantize(a)
                    cache["scales"].append(sc)
                    yield q

            def scales(c=chunks, cache=cache):
                got = cache.pop("scales", None)
                return iter(got) if got is not None else (mxfp8_quantize(a)[1] for _, a in c())

            outs.append(OutTensor(s.name, "F8_E4M3", s.shape, codes))
            outs.append(OutTensor(s.name + "_scale_inv", "U8", (s.shape[0], s.shape[1] // 32), scales))
        else:
            raise SystemExit(f"unknown dtype {dtype}")
    return outs


def quant_ignored_layers(cfg):
    tc = cfg["text_config"]
    ign = ["lm_head", "model.embed_tokens", "vision_tower", "multi_modal_projector", "patch_merge_mlp"]
    for l, f in enumerate(tc.get("moe_layer_freq") or []):
        if f:
            ign.append(f"model.layers.{l}.block_sparse_moe.gate")
    return ign


def apply_overrides(cfg, overrides):
    """--set text_config.num_hidden_layers=4 style overrides; values are JSON (fallback: string)."""
    for ov in overrides or []:
        key, _, val = ov.partition("=")
        try:
            v = json.loads(val)
        except json.JSONDecodeError:
            v = val
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v


def fix_layer_lists(cfg, dense_layers=None):
    """Resize per-layer lists to num_hidden_layers (after an override of the layer count)."""
    tc = cfg["text_config"]
    L = tc["num_hidden_layers"]
    sc = tc.get("sparse_attention_config") or {}

    def resize(lst):
        lst = list(lst or [])
        if len(lst) == L:
            return lst
        if dense_layers is not None:
            return [0 if i < dense_layers else 1 for i in range(L)]
        fill = lst[-1] if lst else 0
        return (lst + [fill] * L)[:L]

    tc["moe_layer_freq"] = resize(tc.get("moe_layer_freq"))
    if sc:
        sc["sparse_attention_freq"] = resize(sc.get("sparse_attention_freq"))
        sc["sparse_disable_index_value"] = resize(sc.get("sparse_disable_index_value"))


def validate(cfg):
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        raise SystemExit("config has no text_config (released VL layout expected)")
    L = tc["num_hidden_layers"]
    sc = tc.get("sparse_attention_config") or {}
    for key, lst in (("moe_layer_freq", tc.get("moe_layer_freq")),
                     ("sparse_attention_freq", sc.get("sparse_attention_freq"))):
        if lst is not None and len(lst) != L:
            raise SystemExit(f"{key} has {len(lst)} entries, num_hidden_layers is {L}")
    if tc["num_attention_heads"] % tc["num_key_value_heads"]:
        raise SystemExit("num_attention_heads must be a multiple of num_key_value_heads")
    if sc.get("use_sparse_attention") and any(sc.get("sparse_attention_freq") or []):
        if sc["sparse_num_index_heads"] != tc["num_key_value_heads"]:
            print("warning: sparse_num_index_heads != num_key_value_heads", file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="config.json in the released VL layout")
    src.add_argument("--preset", choices=PRESETS)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--dtype", choices=["f32", "bf16", "mxfp8"], default="f32")
    ap.add_argument("--base-dtype", choices=["bf16", "f32"], default="bf16",
                    help="with --dtype mxfp8: storage of the unquantised tensors (embed, lm_head, norms); "
                         "router gate and correction bias are always f32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, default=0, help="shard into files of about this many MB")
    ap.add_argument("--set", dest="overrides", action="append", metavar="KEY=JSON",
                    help="override a config key, e.g. text_config.num_hidden_layers=4 (repeatable)")
    ap.add_argument("--dense-layers", type=int, default=None,
                    help="with a changed layer count: first N layers dense attention + dense MLP, rest MSA+MoE")
    ap.add_argument("--no-vision-config", action="store_true", help="omit vision_config from config.json")
    ap.add_argument("--vision-weights", action="store_true",
                    help="also write the vision tower, projector and merge MLP (released names; the patch embedding "
                         "F32, the rest unquantised in the base dtype)")
    args = ap.parse_args(argv)

    if args.config:
        with open(args.config) as f:
            cfg = json.load(f)
    else:
        cfg = preset(args.preset)
    cfg = copy.deepcopy(cfg)
    apply_overrides(cfg, args.overrides)
    fix_layer_lists(cfg, args.dense_layers)
    validate(cfg)
    if args.no_vision_config or cfg.get("vision_config") is None:
        cfg.pop("vision_config", None)

    tc = cfg["text_config"]
    specs = text_tensor_specs(tc)
    if args.vision_weights:
        if cfg.get("vision_config") is None:
            raise SystemExit("--vision-weights needs a vision_config")
        specs += vision_tensor_specs(cfg)
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16", "mxfp8": "bfloat16"}[args.dtype]
    if args.dtype == "mxfp8":
        cfg["quantization_config"] = {"quant_method": "mxfp8", "activation_scheme": "dynamic",
                                      "weight_block_size": [1, 32], "ignored_layers": quant_ignored_layers(cfg)}
    else:
        cfg.pop("quantization_config", None)

    outs = build_out_tensors(specs, args.dtype, args.seed, args.base_dtype)
    os.makedirs(args.out, exist_ok=True)
    meta = {"format": "pt", "generator": "tools/checkpoint/make_checkpoint.py", "seed": args.seed,
            "dtype": args.dtype}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    total = sum(t.nbytes for t in outs)
    if args.shard_mb and total > args.shard_mb * 1e6:
        limit = args.shard_mb * 1e6
        shards, cur, cur_bytes = [], [], 0
        for t in sorted(outs, key=lambda t: t.name):
            if cur and cur_bytes + t.nbytes > limit:
                shards.append(cur)
                cur, cur_bytes = [], 0
            cur.append(t)
            cur_bytes += t.nbytes
        if cur:
            shards.append(cur)
        n = len(shards)
        weight_map = {}
        for i, sh in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            write_safetensors(os.path.join(args.out, fname), sh, meta)
            for t in sh:
                weight_map[t.name] = fname
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
            f.write("\n")
        print(f"wrote {len(outs)} tensors, {total / 1e6:.1f} MB in {n} shards to {args.out}")
    else:
        write_safetensors(os.path.join(args.out, "model.safetensors"), outs, meta)
        print(f"wrote {len(outs)} tensors, {total / 1e6:.1f} MB to {args.out}/model.safetensors")


if __name__ == "__main__":
    main()
