#!/usr/bin/env python3
"""Golden fixtures for m3serve from the HuggingFace reference model (transformers' minimax_m3_vl).

Runs where torch + transformers (with models/minimax_m3_vl) are installed; no network needed.

Modes
  --model DIR          checkpoint written by tools/checkpoint/make_checkpoint.py (released VL layout,
                       f32 / bf16 / mxfp8). Builds MiniMaxM3SparseForConditionalGeneration in fp32 on
                       the CPU, loads our tensors by an explicit name mapping (MXFP8 dequantised here,
                       with torch's float8 type), runs the ids, writes DIR/golden.safetensors and
                       DIR/provenance.json.
  --hf-init CFG --save DIR
                       builds a random HF model from a flat HF config (CFG), re-initialises it with
                       non-trivial norms / correction bias, rounds weights to bf16, save_pretrained()s
                       it to DIR (HF's own checkpoint spelling), reloads it with from_pretrained and
                       writes the goldens for it into DIR.
  --check-mxfp8 F32DIR MXDIR
                       checks our MXFP8 encoder against torch's float8_e4m3fn rounding.

Golden format (contract, see docs/ORACLE.md): golden.safetensors with
  input_ids I32 [T]; logits F32 [T,V]; hidden.{l} F32 [T,hidden] (residual stream after decoder layer l,
  the last one BEFORE the final norm); selection.{l} I32 [Hidx,T,K] (sorted ascending, -1 padded);
  block_scores.{l} F32 [Hidx,T,NB] (score HF ranks: local block +inf, future blocks -inf);
  extras: block_scores_raw.{l}, experts.{l}, expert_weights.{l}.
Every run also compares HF against an independent re-implementation of docs/M3_MODEL.md §3 written here.
"""

import argparse
import copy
import datetime
import hashlib
import json
import math
import os
import re
import sys
import traceback

import numpy as np
import torch

torch.set_grad_enabled(False)

SCRIPT = "scripts/oracle/make_golden.py"
NEG_INF = float("-inf")


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------
# HF imports and introspection
# ----------------------------------------------------------------------------------------------


def hf_modules():
    import transformers
    from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as C
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as M
    return transformers, C, M


def source_hash(mod):
    try:
        with open(mod.__file__, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except Exception:
        return "?"


def config_fields(cls):
    f = getattr(cls, "__dataclass_fields__", None)
    if f:
        return set(f)
    import inspect
    try:
        return set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    except Exception:
        return set()


# ----------------------------------------------------------------------------------------------
# Config mapping: our released VL layout (nested sparse_attention_config) <-> HF's flat keys
# ----------------------------------------------------------------------------------------------

FLAT_FROM_SPARSE = {
    "index_n_heads": "sparse_num_index_heads",
    "index_head_dim": "sparse_index_dim",
    "index_block_size": "sparse_block_size",
    "index_topk_blocks": "sparse_topk_blocks",
    "index_local_blocks": "sparse_local_block",
    "index_init_blocks": "sparse_init_block",
    "index_score_type": "sparse_score_type",
}


def normalise_text_config(tc):
    """Return (flat, nested) views of a text config given in either spelling."""
    tc = dict(tc)
    tc.pop("model_type", None)
    L = tc["num_hidden_layers"]
    sc = dict(tc.get("sparse_attention_config") or {})
    if not sc and "index_block_size" in tc:
        lt = tc.get("layer_types") or ["full_attention"] * L
        freq = [1 if t == "minimax_m3_sparse" else 0 for t in lt]
        sc = {"use_sparse_attention": any(freq), "sparse_attention_freq": freq,
              "sparse_disable_index_value": freq, "sparse_init_block": 0, "sparse_local_block": 1,
              "sparse_score_type": "max"}
        for flat, nested in FLAT_FROM_SPARSE.items():
            if flat in tc:
                sc[nested] = tc[flat]
    freq = sc.get("sparse_attention_freq") or [0] * L
    if not sc.get("use_sparse_attention", True):
        freq = [0] * L
    flat = dict(tc)
    for k, v in FLAT_FROM_SPARSE.items():
        if v in sc and k not in flat:
            flat[k] = sc[v]
    flat["layer_types"] = ["minimax_m3_sparse" if f else "full_attention" for f in freq]
    if sc:
        flat["sparse_attention_config"] = sc
    if "moe_layer_freq" not in flat and "mlp_layer_types" in flat:
        flat["moe_layer_freq"] = [0 if t in ("dense", "mlp", "dense_mlp") else 1 for t in flat["mlp_layer_types"]]
    hd = flat.get("head_dim") or flat["hidden_size"] // flat["num_attention_heads"]
    rp = dict(flat.get("rope_parameters") or {})
    rp.setdefault("rope_type", "default")
    if "rope_theta" in flat:
        rp["rope_theta"] = flat["rope_theta"]
    if "rotary_dim" in flat:
        rp["partial_rotary_factor"] = flat["rotary_dim"] / hd
    elif "partial_rotary_factor" in flat:
        rp["partial_rotary_factor"] = flat["partial_rotary_factor"]
    flat["rope_parameters"] = rp
    flat.setdefault("rotary_dim", int(round(hd * rp.get("partial_rotary_factor", 1.0))))
    return flat, sc, freq


def build_hf_config(C, text_flat, vision, top, mlp_types=None, dense_only=False):
    """MiniMaxM3VLConfig from our normalised keys, passing only fields the installed class knows."""
    tfields = config_fields(C.MiniMaxM3VLTextConfig)
    tkw = dict(text_flat)
    tkw.pop("hidden_act", None)  # HF hard-codes SwiGLU-OAI; "swigluoai" is not an ACT2FN name
    if dense_only:
        tkw["layer_types"] = ["full_attention"] * tkw["num_hidden_layers"]
        if "sparse_attention_config" in tkw:
            sc = dict(tkw["sparse_attention_config"])
            sc["sparse_attention_freq"] = [0] * tkw["num_hidden_layers"]
            sc["use_sparse_attention"] = False
            tkw["sparse_attention_config"] = sc
    if mlp_types is not None:
        tkw["mlp_layer_types"] = [mlp_types[1] if f else mlp_types[0] for f in tkw["moe_layer_freq"]]
    if tfields:
        dropped = sorted(k for k in tkw if k not in tfields)
        tkw = {k: v for k, v in tkw.items() if k in tfields}
    else:
        dropped = []
    vkw = dict(vision or {})
    vkw.pop("model_type", None)
    vfields = config_fields(C.MiniMaxM3VLVisionConfig)
    if vfields:
        vkw = {k: v for k, v in vkw.items() if k in vfields}
    kw = {"text_config": tkw, "vision_config": vkw}
    tfields_top = config_fields(C.MiniMaxM3VLConfig)
    for k in ("projector_hidden_size", "image_token_index", "video_token_index"):
        if k in top and (not tfields_top or k in tfields_top):
            kw[k] = top[k]
    cfg = C.MiniMaxM3VLConfig(**kw)
    return cfg, dropped


def set_eager(cfg):
    for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "vision_config", None)):
        if c is None:
            continue
        try:
            c._attn_implementation = "eager"
        except Exception:
            pass


def text_model(model):
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("TextModel"):
            return name, mod
    raise RuntimeError("no *TextModel submodule found")


def check_structure(model, text_flat):
    """Layer kinds of the built HF model must match the config (else the config mapping is wrong)."""
    _, tm = text_model(model)
    problems = []
    L = text_flat["num_hidden_layers"]
    for l, layer in enumerate(tm.layers):
        names = {n for n, _ in layer.named_modules()}
        has_idx = any("indexer" in n or "index_q" in n for n in names)
        has_exp = any(n.endswith("experts") for n in names)
        want_idx = text_flat["layer_types"][l] == "minimax_m3_sparse"
        want_exp = bool(text_flat["moe_layer_freq"][l])
        if has_idx != want_idx or has_exp != want_exp:
            problems.append(f"layer {l}: indexer {has_idx} (want {want_idx}), experts {has_exp} (want {want_exp})")
    if len(tm.layers) != L:
        problems.append(f"{len(tm.layers)} layers, want {L}")
    return problems


def build_model(C, M, text_flat, vision, top, dense_only=False, seed=0):
    """Try config variants until the built model's structure matches; returns (model, notes)."""
    attempts = [None, ("dense", "sparse"), ("dense", "moe"), ("dense", "sparse_moe")]
    errors = []
    for mlp_types in attempts:
        try:
            cfg, dropped = build_hf_config(C, text_flat, vision, top, mlp_types, dense_only)
            set_eager(cfg)
            torch.manual_seed(seed)
            model = M.MiniMaxM3SparseForConditionalGeneration(cfg).float().eval()
            try:
                model.set_attn_implementation("eager")
            except Exception:
                pass
            want = dict(text_flat)
            if dense_only:
                want["layer_types"] = ["full_attention"] * want["num_hidden_layers"]
            problems = check_structure(model, want)
            if problems:
                errors.append(f"mlp_types={mlp_types}: {problems}")
                continue
            return model, {"dropped_text_keys": dropped, "mlp_types": mlp_types,
                           "attn_implementation": getattr(model.config, "_attn_implementation", "?")}
        except Exception as e:  # try the next variant
            errors.append(f"mlp_types={mlp_types}: {type(e).__name__}: {e}")
    raise RuntimeError("could not build a matching HF model:\n  " + "\n  ".join(errors))


# ----------------------------------------------------------------------------------------------
# Our checkpoint -> fp32 tensors (safetensors library; MXFP8 via torch.float8_e4m3fn)
# ----------------------------------------------------------------------------------------------


def canonical_name(n):
    if n.startswith("model.language_model."):
        return "language_model.model." + n[len("model.language_model."):]
    if n.startswith("lm_head."):
        return "language_model." + n
    if n.startswith("model.") and not n.startswith("model.vision"):
        return "language_model." + n
    return n


def load_checkpoint(d):
    from safetensors import safe_open
    files = []
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    raw = {}
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="pt") as f:
            for k in f.keys():
                raw[k] = f.get_tensor(k)
    out, dtypes = {}, {}
    for k, t in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = raw.get(k + "_scale_inv")
            if s is None:
                raise RuntimeError(f"{k}: FP8 weight without {k}_scale_inv")
            assert s.dtype == torch.uint8 and s.shape[0] == t.shape[0] and s.shape[1] * 32 == t.shape[1], k
            scale = torch.exp2(s.to(torch.float32) - 127.0).repeat_interleave(32, dim=1)
            v = t.to(torch.float32) * scale
            dtypes[canonical_name(k)] = "mxfp8"
        else:
            v = t.to(torch.float32)
            dtypes[canonical_name(k)] = str(t.dtype).replace("torch.", "")
        out[canonical_name(k)] = v
    return out, dtypes


# ----------------------------------------------------------------------------------------------
# Name mapping: HF parameter -> tensor built from our checkpoint names
# ----------------------------------------------------------------------------------------------


class Mapper:
    def __init__(self, ck, text_flat):
        self.ck = ck
        self.used = set()
        self.moe = text_flat["moe_layer_freq"]
        self.E = text_flat["num_local_experts"]

    def get(self, n):
        if n not in self.ck:
            raise KeyError(n)
        self.used.add(n)
        return self.ck[n]

    def source(self, hf_name, shape):
        n = hf_name
        if re.search(r"(^|\.)(vision_tower|vision_model|multi_modal_projector|patch_merge(_mlp)?)\.", n):
            return "skip"
        m = re.search(r"language_model\.(embed_tokens|norm)\.weight$", n)
        if m:
            return self.get(f"language_model.model.{m.group(1)}.weight")
        if n == "lm_head.weight" or n.endswith(".lm_head.weight"):
            return self.get("language_model.lm_head.weight")
        m = re.search(r"layers\.(\d+)\.(.+)$", n)
        if not m:
            raise KeyError(f"unmapped HF name {n}")
        l, s = int(m.group(1)), m.group(2)
        P = f"language_model.model.layers.{l}."
        if s in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            return self.get(P + s)
        m = re.fullmatch(r"self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight", s)
        if m:
            return self.get(P + s)
        m = re.fullmatch(r"self_attn\.indexer\.(q_proj|k_proj|q_norm|k_norm)\.weight", s)
        if m:
            return self.get(P + "self_attn.index_" + m.group(1) + ".weight")
        m = re.fullmatch(r"self_attn\.(index_\w+)\.weight", s)
        if m:
            return self.get(P + s)
        m = re.fullmatch(r"(?:mlp|block_sparse_moe)\.(.+)", s)
        if not m:
            raise KeyError(f"unmapped HF name {n}")
        sub = m.group(1)
        if not self.moe[l]:
            D = P + "mlp."
            if sub == "gate_up_proj.weight":
                return torch.cat([self.get(D + "gate_proj.weight"), self.get(D + "up_proj.weight")], 0)
            if sub in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
                return self.get(D + sub)
            raise KeyError(f"unmapped HF name {n}")
        B = P + "block_sparse_moe."
        if sub == "gate.weight":
            return self.get(B + "gate.weight")
        if sub in ("gate.e_score_correction_bias", "e_score_correction_bias"):
            return self.get(B + "e_score_correction_bias")
        E = self.E
        if sub == "experts.gate_up_proj":
            t = torch.stack([torch.cat([self.get(f"{B}experts.{e}.w1.weight"), self.get(f"{B}experts.{e}.w3.weight")], 0)
                             for e in range(E)])
            return t if tuple(t.shape) == tuple(shape) else t.transpose(1, 2)
        if sub == "experts.down_proj":
            t = torch.stack([self.get(f"{B}experts.{e}.w2.weight") for e in range(E)])
            return t if tuple(t.shape) == tuple(shape) else t.transpose(1, 2)
        if sub in ("experts.gate_proj", "experts.up_proj"):
            w = "w1" if sub.endswith("gate_proj") else "w3"
            t = torch.stack([self.get(f"{B}experts.{e}.{w}.weight") for e in range(E)])
            return t if tuple(t.shape) == tuple(shape) else t.transpose(1, 2)
        m = re.fullmatch(r"experts\.(\d+)\.(w1|w2|w3)\.weight", sub)
        if m:
            return self.get(B + sub)
        m = re.fullmatch(r"shared_experts?\.(gate_up_proj|gate_proj|up_proj|down_proj)\.weight", sub)
        if m:
            S = B + "shared_experts."
            if m.group(1) == "gate_up_proj":
                return torch.cat([self.get(S + "gate_proj.weight"), self.get(S + "up_proj.weight")], 0)
            return self.get(S + m.group(1) + ".weight")
        raise KeyError(f"unmapped HF name {n}")


def load_into_hf(model, ck, text_flat, allow_unused=()):
    sd = model.state_dict()
    mp = Mapper(ck, text_flat)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    skipped, errors = 0, []
    for name, cur in sd.items():
        if name.endswith("inv_freq"):
            continue
        try:
            src = mp.source(name, cur.shape)
        except KeyError as e:
            errors.append(str(e))
            continue
        if isinstance(src, str):
            skipped += 1
            continue
        if tuple(src.shape) != tuple(cur.shape):
            errors.append(f"{name}: checkpoint shape {tuple(src.shape)} != HF {tuple(cur.shape)}")
            continue
        target = params.get(name, buffers.get(name))
        if target is None:
            errors.append(f"{name}: not a parameter or buffer")
            continue
        target.data.copy_(src.to(target.dtype))
    unused = sorted(set(ck) - mp.used)
    unused = [u for u in unused if not any(a in u for a in allow_unused)
              and not re.search(r"(^|\.)(vision_tower|vision_model|multi_modal_projector|patch_merge)", u)]
    if unused:
        errors.append(f"checkpoint tensors not used: {unused[:20]} ({len(unused)})")
    if errors:
        raise RuntimeError("weight mapping failed:\n  " + "\n  ".join(errors[:40]))
    return {"skipped_vision_tensors": skipped, "mapped": len(mp.used)}


# ----------------------------------------------------------------------------------------------
# Independent re-implementation of docs/M3_MODEL.md §3 (fp32), from our checkpoint names
# ----------------------------------------------------------------------------------------------


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rope(x, pos, theta, rdim):
    """NeoX half-split RoPE on the first rdim channels; x [T, heads, D] or [T, D], pos [T]."""
    half = rdim // 2
    inv = 1.0 / (theta ** (torch.arange(0, rdim, 2, dtype=torch.int64).float() / rdim))
    ang = pos.float()[:, None] * inv[None, :]  # [T, half], fp32
    cos, sin = ang.cos(), ang.sin()
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    a, b, rest = x[..., :half], x[..., half:rdim], x[..., rdim:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], -1)


def swiglu_oai(x, wg, wu, wd, alpha, limit):
    g = (x @ wg.T).clamp(max=limit)
    u = (x @ wu.T).clamp(min=-limit, max=limit)
    return ((u + 1.0) * g * torch.sigmoid(alpha * g)) @ wd.T


def reference_forward(ck, tf, ids):
    """Returns logits [T,V], hidden list, selections {l: [H,T,K] sorted}, raw block scores {l}."""
    g = lambda n: ck[n]
    T = ids.shape[0]
    H, L = tf["hidden_size"], tf["num_hidden_layers"]
    nq, nkv = tf["num_attention_heads"], tf["num_key_value_heads"]
    hd = tf.get("head_dim") or H // nq
    eps = tf.get("rms_norm_eps", 1e-6)
    theta = tf["rope_parameters"]["rope_theta"]
    rdim = tf["rotary_dim"]
    alpha, limit = tf.get("swiglu_alpha", 1.702), tf.get("swiglu_limit", 7.0)
    pos = torch.arange(T)
    causal = pos[None, :] <= pos[:, None]  # [Tq, Tk]
    x = g("language_model.model.embed_tokens.weight")[ids]
    hidden, sels, raws = [], {}, {}
    for l in range(L):
        P = f"language_model.model.layers.{l}."
        h = rms(x, g(P + "input_layernorm.weight"), eps)
        q = (h @ g(P + "self_attn.q_proj.weight").T).view(T, nq, hd)
        k = (h @ g(P + "self_attn.k_proj.weight").T).view(T, nkv, hd)
        v = (h @ g(P + "self_attn.v_proj.weight").T).view(T, nkv, hd)
        q = rope(rms(q, g(P + "self_attn.q_norm.weight"), eps), pos, theta, rdim)
        k = rope(rms(k, g(P + "self_attn.k_norm.weight"), eps), pos, theta, rdim)
        allow = causal[None].expand(nkv, T, T)  # per KV head
        if tf["layer_types"][l] == "minimax_m3_sparse":
            Hi, D = tf["index_n_heads"], tf["index_head_dim"]
            Bs, K = tf["index_block_size"], tf["index_topk_blocks"]
            iq = (h @ g(P + "self_attn.index_q_proj.weight").T).view(T, Hi, D)
            ik = h @ g(P + "self_attn.index_k_proj.weight").T
            iq = rope(rms(iq, g(P + "self_attn.index_q_norm.weight"), eps), pos, theta, rdim)
            ik = rope(rms(ik, g(P + "self_attn.index_k_norm.weight"), eps), pos, theta, rdim)
            s = torch.einsum("thd,sd->hts", iq, ik).masked_fill(~causal[None], NEG_INF)
            NB = -(-T // Bs)
            s = torch.nn.functional.pad(s, (0, NB * Bs - T), value=NEG_INF)
            raw = s.view(Hi, T, NB, Bs).amax(-1)  # [Hi, T, NB], -inf on future blocks
            raws[l] = raw
            sel = torch.full((Hi, T, K), -1, dtype=torch.int32)
            blk_allow = torch.zeros(Hi, T, NB, dtype=torch.bool)
            for t in range(T):
                local = t // Bs
                if local + 1 <= K:
                    chosen = torch.arange(local + 1).expand(Hi, -1)
                else:
                    top = raw[:, t, :local].topk(K - 1, dim=-1).indices
                    chosen = torch.cat([top, torch.full((Hi, 1), local)], -1)
                chosen = chosen.sort(-1).values
                sel[:, t, :chosen.shape[1]] = chosen.to(torch.int32)
                blk_allow[torch.arange(Hi)[:, None], t, chosen] = True
            sels[l] = sel
            assert Hi == nkv, "index heads must equal KV heads"
            key_allow = blk_allow.repeat_interleave(Bs, dim=-1)[..., :T]
            allow = allow & key_allow
        G = nq // nkv
        att = torch.einsum("thd,shd->hts", q, k.repeat_interleave(G, dim=1)) / math.sqrt(hd)
        att = att.masked_fill(~allow.repeat_interleave(G, dim=0), NEG_INF).softmax(-1)
        o = torch.einsum("hts,shd->thd", att, v.repeat_interleave(G, dim=1)).reshape(T, nq * hd)
        x = x + o @ g(P + "self_attn.o_proj.weight").T
        h2 = rms(x, g(P + "post_attention_layernorm.weight"), eps)
        if tf["moe_layer_freq"][l]:
            B = P + "block_sparse_moe."
            r = h2 @ g(B + "gate.weight").T
            sc = torch.sigmoid(r)
            choice = (sc + g(B + "e_score_correction_bias")).topk(tf["num_experts_per_tok"], -1).indices
            w = sc.gather(1, choice)
            w = w / w.sum(-1, keepdim=True) * tf["routed_scaling_factor"]
            y = swiglu_oai(h2, g(B + "shared_experts.gate_proj.weight"), g(B + "shared_experts.up_proj.weight"),
                           g(B + "shared_experts.down_proj.weight"), alpha, limit)
            for e in range(tf["num_local_experts"]):
                rows, slot = (choice == e).nonzero(as_tuple=True)
                if rows.numel() == 0:
                    continue
                ye = swiglu_oai(h2[rows], g(f"{B}experts.{e}.w1.weight"), g(f"{B}experts.{e}.w3.weight"),
                                g(f"{B}experts.{e}.w2.weight"), alpha, limit)
                y = y.index_add(0, rows, ye * w[rows, slot, None])
        else:
            y = swiglu_oai(h2, g(P + "mlp.gate_proj.weight"), g(P + "mlp.up_proj.weight"),
                           g(P + "mlp.down_proj.weight"), alpha, limit)
        x = x + y
        hidden.append(x)
    logits = rms(x, g("language_model.model.norm.weight"), eps) @ g("language_model.lm_head.weight").T
    return logits, hidden, sels, raws


# ----------------------------------------------------------------------------------------------
# Running HF with hooks
# ----------------------------------------------------------------------------------------------


def layer_index(name):
    m = re.search(r"layers\.(\d+)\.", name + ".")
    return int(m.group(1)) if m else None


def run_hf(model, ids, M, tf):
    """Forward with hooks. Returns dict with logits, per-layer outputs, indexer captures, router captures."""
    tname, tm = text_model(model)
    caps = {"layer_out": {}, "indexer": {}, "router": {}}
    hooks = []
    for l, layer in enumerate(tm.layers):
        hooks.append(layer.register_forward_hook(
            lambda mod, a, out, l=l: caps["layer_out"].__setitem__(l, (out[0] if isinstance(out, tuple) else out).detach().clone())))
    for name, mod in tm.named_modules():
        cls = type(mod).__name__
        l = layer_index(name)
        if cls.endswith("Indexer"):
            hooks.append(mod.register_forward_hook(
                lambda m_, a, kw, out, l=l, m2=mod: caps["indexer"].__setitem__(l, (m2, a, kw, out)), with_kwargs=True))
        elif cls.endswith("TopKRouter") or (cls.endswith("Router") and "gate" in name.split(".")[-1]):
            hooks.append(mod.register_forward_hook(
                lambda m_, a, kw, out, l=l, m2=mod: caps["router"].__setitem__(l, (m2, a, kw, out)), with_kwargs=True))
    try:
        out = model(input_ids=ids[None], use_cache=False, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    caps["logits"] = out.logits[0].float()
    caps["hf_hidden_states"] = [h[0].float() for h in (out.hidden_states or [])]
    return caps


def hidden_convention(caps, model, tf):
    """Which HF hidden_states index equals our per-layer output (and is the last one normed?)."""
    hs = caps["hf_hidden_states"]
    L = tf["num_hidden_layers"]
    notes = {"n_hf_hidden_states": len(hs)}
    if not hs:
        return notes
    diffs = []
    for l in range(L):
        if l + 1 < len(hs):
            diffs.append(float((hs[l + 1] - caps["layer_out"][l][0]).abs().max()))
    notes["max_abs(hf_hidden_states[l+1] - layer_l_output)"] = diffs
    if len(hs) == L + 1:
        _, tm = text_model(model)
        normed = tm.norm(caps["layer_out"][L - 1][0])
        notes["hf_hidden_states[L]_equals_final_norm_output"] = bool(torch.allclose(hs[L], normed, atol=1e-6, rtol=0))
        notes["hf_hidden_states[L]_equals_prenorm_layer_output"] = bool(torch.allclose(hs[L], caps["layer_out"][L - 1][0], atol=1e-6, rtol=0))
    return notes


def hf_selection(caps_entry, tf, T):
    """Indexer output -> [Hidx, T, K] sorted ascending, -1 padded; plus HF's own order and the mode."""
    mod, a, kw, out = caps_entry
    K = tf["index_topk_blocks"]
    Hi = tf["index_n_heads"]
    o = out[0] if isinstance(out, tuple) else out
    if o.dtype.is_floating_point:
        raise RuntimeError(f"indexer returned a float tensor {tuple(o.shape)} (mask variant), not block ids")
    o = o.detach().to(torch.int64)
    if o.dim() == 4:      # [B, H, T, K']
        o, mode = o[0], "per_head"
    elif o.dim() == 3:    # [B, T, K'] shared by all heads
        o, mode = o[0][None].expand(Hi, -1, -1), "shared_over_heads"
    else:
        raise RuntimeError(f"unexpected indexer output shape {tuple(o.shape)}")
    if o.shape[0] != Hi:
        raise RuntimeError(f"indexer output has {o.shape[0]} heads, config says {Hi}")
    hf_order = o.clone()
    big = torch.iinfo(torch.int64).max
    srt = torch.where(o < 0, torch.full_like(o, big), o).sort(-1).values
    srt = torch.where(srt == big, torch.full_like(srt, -1), srt)
    res = torch.full((Hi, T, K), -1, dtype=torch.int64)
    res[..., :srt.shape[-1]] = srt[..., :K]
    return res.to(torch.int32), hf_order, mode


def hf_index_qk(caps_entry, M, tf):
    """Recompute the indexer's q/k with the HF module's own weights and HF's rotary function."""
    mod, a, kw, out = caps_entry
    hs = a[0] if a else kw["hidden_states"]
    pe = a[1] if len(a) > 1 else kw["position_embeddings"]
    b, s, _ = hs.shape
    Hi, D = tf["index_n_heads"], tf["index_head_dim"]
    qp = getattr(mod, "q_proj", None) or getattr(mod, "wq", None)
    kp = getattr(mod, "k_proj", None) or getattr(mod, "wk", None)
    iq = mod.q_norm(qp(hs).view(b, s, Hi, D)).transpose(1, 2)
    ik = mod.k_norm(kp(hs).view(b, s, 1, D)).transpose(1, 2)
    cos, sin = pe
    iq, ik = M.apply_rotary_pos_emb(iq, ik, cos[..., :D], sin[..., :D])
    return iq[0].float(), ik[0, 0].float(), hs[0]


def block_scores_from_qk(iq, ik, Bs):
    """iq [H,T,D], ik [T,D] -> raw [H,T,NB] (max over causal keys; -inf for future blocks)."""
    H, T, _ = iq.shape
    s = torch.einsum("htd,sd->hts", iq, ik)
    causal = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
    s = s.masked_fill(~causal[None], NEG_INF)
    NB = -(-T // Bs)
    s = torch.nn.functional.pad(s, (0, NB * Bs - T), value=NEG_INF)
    return s.view(H, T, NB, Bs).amax(-1)


def ranked_scores(raw, Bs):
    """The score HF ranks: raw causal max, local block forced to +inf, future blocks -inf."""
    H, T, NB = raw.shape
    r = raw.clone()
    local = torch.arange(T) // Bs
    r[:, torch.arange(T), local] = float("inf")
    return r


NEAR_TIE_REL = 1e-4  # gap <= 1e-4 * max(1, |score|): two fp32 implementations may order these differently


def tie_stats(raw, Bs, K):
    """Ties at the top-k boundary: gap between the (K-1)-th and K-th best history block (local excluded).

    A different but correct fp32 implementation (other summation order) moves block scores by ~1e-5
    relative, so the listed near ties are the (head, position) pairs whose selection may legitimately
    differ from HF's."""
    H, T, NB = raw.shape
    exact, near, n_sparse, min_gap = [], [], 0, float("inf")
    for t in range(T):
        local = t // Bs
        if local + 1 <= K:
            continue
        srt = raw[:, t, :local].sort(-1, descending=True).values
        a, b = srt[:, K - 2], srt[:, K - 1]
        n_sparse += H
        for h in range(H):
            gap = float(a[h] - b[h])
            min_gap = min(min_gap, gap)
            if gap == 0.0:
                exact.append([h, t])
            elif gap <= NEAR_TIE_REL * max(1.0, abs(float(a[h]))):
                near.append([h, t, gap])
    return {"exact_ties": exact, "near_ties": near, "near_tie_rule": f"gap <= {NEAR_TIE_REL} * max(1, |score|)",
            "min_gap_at_topk_boundary": min_gap, "sparse_query_head_pairs": n_sparse}


# ----------------------------------------------------------------------------------------------
# Golden writing
# ----------------------------------------------------------------------------------------------


def make_ids(args, V):
    if args.ids and os.path.exists(args.ids):
        with open(args.ids) as f:
            txt = f.read()
        try:
            ids = json.loads(txt)
        except json.JSONDecodeError:
            ids = [int(t) for t in txt.split()]
        return torch.tensor(ids, dtype=torch.int64), f"file:{args.ids}"
    rng = np.random.default_rng(args.ids_seed)
    return torch.tensor(rng.integers(0, V, size=args.T), dtype=torch.int64), f"numpy default_rng({args.ids_seed}).integers(0,{V},{args.T})"


def golden_for_model(model, M, tf, ids, ck, outdir, meta, prov, dense_model=None, hf_tensor_names=None):
    T = ids.shape[0]
    transformers, _, _ = hf_modules()
    caps = run_hf(model, ids, M, tf)
    tensors = {"input_ids": ids.to(torch.int32), "logits": caps["logits"].contiguous()}
    L = tf["num_hidden_layers"]
    for l in range(L):
        tensors[f"hidden.{l}"] = caps["layer_out"][l][0].float().contiguous()
    prov["hidden_convention_check"] = hidden_convention(caps, model, tf)
    checks = prov.setdefault("checks", {})
    sel_info = {}
    Bs, K = tf.get("index_block_size"), tf.get("index_topk_blocks")
    for l in range(L):
        if tf["layer_types"][l] != "minimax_m3_sparse":
            continue
        info = {}
        try:
            sel, hf_order, mode = hf_selection(caps["indexer"][l], tf, T)
            tensors[f"selection.{l}"] = sel.contiguous()
            info["mode"] = mode
            # HF's own slot order: is the local block first? is it score-descending?
            local = torch.arange(T) // Bs
            info["hf_slot0_is_local_fraction"] = float((hf_order[:, :, 0] == local[None]).float().mean())
            info["hf_valid_ids_left_packed"] = bool(all(
                ((hf_order[h, t] >= 0).long().diff() <= 0).all() for h in range(hf_order.shape[0]) for t in range(0, T, 7)))
        except Exception as e:
            info["selection_error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            sel = None
        try:
            iq, ik, _ = hf_index_qk(caps["indexer"][l], M, tf)
            raw = block_scores_from_qk(iq, ik, Bs)
            if info.get("mode") == "shared_over_heads":
                raw_for_rank = raw.amax(0, keepdim=True).expand_as(raw).clone()
            else:
                raw_for_rank = raw
            ranked = ranked_scores(raw_for_rank, Bs)
            tensors[f"block_scores.{l}"] = ranked.contiguous()
            tensors[f"block_scores_raw.{l}"] = raw.contiguous()
            # our top-k on those scores must give HF's selection (up to exact ties)
            if sel is not None:
                mine = torch.full_like(sel, -1)
                for t in range(T):
                    n = t // Bs + 1
                    kk = min(K, n)
                    top = ranked[:, t, :n].topk(kk, -1).indices.sort(-1).values
                    mine[:, t, :kk] = top.to(torch.int32)
                mism = (mine != sel).any(-1)
                info["selection_mismatch_vs_rescored_topk"] = int(mism.sum())
                info["selection_mismatch_positions"] = mism.nonzero().tolist()[:20]
            info["ties"] = tie_stats(raw_for_rank, Bs, K)
            info["fraction_of_query_heads_dropping_blocks"] = float(((torch.arange(T) // Bs + 1) > K).float().mean())
        except Exception as e:
            info["block_score_error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        sel_info[l] = info
    prov["sparse_layers"] = sel_info
    meta["ties"] = {str(l): {"exact": i.get("ties", {}).get("exact_ties"), "near": i.get("ties", {}).get("near_ties"),
                             "rule": i.get("ties", {}).get("near_tie_rule")} for l, i in sel_info.items()}
    # router: chosen experts (sorted ascending) and final weights (renormalised x routed_scaling_factor)
    rinfo = {}
    for l in range(L):
        if not tf["moe_layer_freq"][l] or l not in caps["router"]:
            continue
        mod, a, kw, out = caps["router"][l]
        logits_r, w_hf, idx_hf = out[0], out[1], out[2]
        idx_hf = idx_hf.to(torch.int64)
        order = idx_hf.sort(-1)
        w_sorted = w_hf.float().gather(1, order.indices) * tf["routed_scaling_factor"]
        tensors[f"experts.{l}"] = order.values.to(torch.int32).contiguous()
        tensors[f"expert_weights.{l}"] = w_sorted.contiguous()
        sc = torch.sigmoid(logits_r.float())
        bias = ck.get(f"language_model.model.layers.{l}.block_sparse_moe.e_score_correction_bias") if ck else None
        if bias is None:
            bias = getattr(mod, "e_score_correction_bias", None)
        r = {"weights_sum_mean": float(w_hf.float().sum(-1).mean()),
             "weights_sum_max_dev_from_1": float((w_hf.float().sum(-1) - 1).abs().max())}
        if bias is not None:
            nb = sc.topk(tf["num_experts_per_tok"], -1).indices.sort(-1).values
            wb = (sc + bias).topk(tf["num_experts_per_tok"], -1).indices.sort(-1).values
            r["tokens_where_bias_changed_choice"] = int((nb != wb).any(-1).sum())
            r["hf_choice_equals_topk(sigmoid+bias)"] = bool((wb == order.values).all())
            ws = sc.gather(1, order.values)
            r["hf_weights_equal_unbiased_sigmoid_renorm_max_diff"] = float((ws / ws.sum(-1, keepdim=True) - w_hf.float().gather(1, order.indices)).abs().max())
        r["expert_histogram"] = torch.bincount(idx_hf.flatten(), minlength=tf["num_local_experts"]).tolist()
        rinfo[l] = r
    prov["moe_layers"] = rinfo
    # independent re-implementation of the spec
    if ck is not None:
        try:
            rl, rh, rs, rr = reference_forward(ck, tf, ids)
            lg = caps["logits"]
            checks["spec_reimpl_logits_max_abs_diff"] = float((rl - lg).abs().max())
            checks["spec_reimpl_logits_max_rel_diff"] = float(((rl - lg).abs() / lg.abs().clamp(min=1e-3)).max())
            checks["spec_reimpl_hidden_max_abs_diff"] = [float((rh[l] - tensors[f"hidden.{l}"]).abs().max()) for l in range(L)]
            checks["spec_reimpl_selection_mismatch"] = {
                l: int((rs[l] != tensors[f"selection.{l}"]).any(-1).sum()) for l in rs if f"selection.{l}" in tensors}
            checks["spec_reimpl_raw_block_score_max_abs_diff"] = {
                l: float((torch.nan_to_num(rr[l], neginf=0) - torch.nan_to_num(tensors[f"block_scores_raw.{l}"], neginf=0)).abs().max())
                for l in rr if f"block_scores_raw.{l}" in tensors}
        except Exception as e:
            checks["spec_reimpl_error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    # dense checks: prefix consistency at T < K*B, and equality with a dense-attention model there
    if Bs and K:
        Ts = K * Bs - 5
        try:
            c2 = run_hf(model, ids[:Ts], M, tf)
            checks["short_run_T"] = Ts
            checks["short_run_logits_vs_full_prefix_max_abs_diff"] = float((c2["logits"] - caps["logits"][:Ts]).abs().max())
            dense_ok = True
            for l in range(L):
                if tf["layer_types"][l] == "minimax_m3_sparse":
                    s2, _, _ = hf_selection(c2["indexer"][l], tf, Ts)
                    for t in range(Ts):
                        want = torch.arange(t // Bs + 1)
                        if not all(torch.equal(s2[h, t, :len(want)].long(), want) and bool((s2[h, t, len(want):] == -1).all())
                                   for h in range(s2.shape[0])):
                            dense_ok = False
            checks["short_run_all_selections_dense"] = dense_ok
            if dense_model is not None:
                c3 = run_hf(dense_model, ids[:Ts], M, tf)
                checks["short_run_vs_dense_attention_model_max_abs_diff"] = float((c3["logits"] - c2["logits"]).abs().max())
                c4 = run_hf(dense_model, ids, M, tf)
                d = (c4["logits"] - caps["logits"]).abs().max(-1).values
                checks["full_run_vs_dense_model_max_abs_diff_before_K*B"] = float(d[:K * Bs].max())
                checks["full_run_vs_dense_model_max_abs_diff_from_K*B"] = float(d[K * Bs:].max()) if T > K * Bs else None
        except Exception as e:
            checks["short_run_error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    # write
    os.makedirs(outdir, exist_ok=True)
    from safetensors.torch import save_file
    meta = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in meta.items()}
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(outdir, "golden.safetensors"), metadata=meta)
    prov["golden_tensors"] = {k: [str(v.dtype).replace("torch.", ""), list(v.shape)] for k, v in sorted(tensors.items())}
    prov["metadata"] = meta
    if hf_tensor_names is not None:
        prov["hf_checkpoint_tensor_names_sample"] = hf_tensor_names
    with open(os.path.join(outdir, "provenance.json"), "w") as f:
        json.dump(prov, f, indent=2, default=str)
        f.write("\n")
    log(json.dumps({"outdir": outdir, "checks": checks, "sparse": sel_info, "moe": rinfo,
                    "hidden": prov["hidden_convention_check"]}, indent=1, default=str)[:12000])


HIDDEN_CONVENTION = ("hidden.{l} = residual stream after decoder layer l (output of layers[l], forward hook), "
                     "= HF hidden_states[l+1] for l < L-1; hidden.{L-1} is BEFORE the final norm")
SEL_CONVENTION = "selection.{l} [Hidx,T,K]: per index head (= KV head) selected block ids sorted ascending, valid first, -1 padding"
SCORE_CONVENTION = ("block_scores.{l} [Hidx,T,NB]: what HF ranks = max over causal keys (j<=p) of iq.ik (fp32, no scale), "
                    "local block (p//B) = +inf, future blocks = -inf; block_scores_raw.{l}: same without the +inf on the local block")


def common_meta(args, tf, dtype_desc, ids_desc, config_name):
    transformers, C, M = hf_modules()
    return {
        "script": SCRIPT,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "modeling_source_sha256_16": source_hash(M),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "config_name": config_name,
        "seed": str(args.seed),
        "ids": ids_desc,
        "dtype": dtype_desc,
        "compute": "fp32 on CPU, attn_implementation=eager",
        "hidden_state_convention": HIDDEN_CONVENTION,
        "selection_convention": SEL_CONVENTION,
        "block_scores_convention": SCORE_CONVENTION,
        "experts_convention": "experts.{l} I32 [T,topk] chosen experts sorted ascending; expert_weights.{l} F32 [T,topk] "
                              "matching: renormalised unbiased sigmoid x routed_scaling_factor",
    }


# ----------------------------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------------------------


def make_dense_model(C, M, tf, cfg, ck, seed, notes):
    """Same weights, every layer dense attention (index tensors unused): the T < K*B reference."""
    if not any(t == "minimax_m3_sparse" for t in tf["layer_types"]):
        return None
    try:
        dm, _ = build_model(C, M, tf, cfg.get("vision_config"), cfg, dense_only=True, seed=seed)
        load_into_hf(dm, ck, tf, allow_unused=("index_",))
        return dm
    except Exception as e:
        notes["dense_model_error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        return None


def mode_model(args):
    transformers, C, M = hf_modules()
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    tf, sc, _ = normalise_text_config(cfg["text_config"])
    ck, dtypes = load_checkpoint(args.model)
    model, notes = build_model(C, M, tf, cfg.get("vision_config"), cfg, seed=args.seed)
    load_notes = load_into_hf(model, ck, tf)
    dense_model = make_dense_model(C, M, tf, cfg, ck, args.seed, notes)
    ids, ids_desc = make_ids(args, tf["vocab_size"])
    qc = cfg.get("quantization_config")
    dtype_desc = "mxfp8 (dequantised to fp32 by the oracle)" if qc else sorted(set(dtypes.values()))[0]
    config_name = args.name or os.path.basename(os.path.normpath(args.model))
    meta = common_meta(args, tf, dtype_desc, ids_desc, config_name)
    meta["checkpoint_generator"] = "tools/checkpoint/make_checkpoint.py"
    prov = {"meta_note": "same facts as golden.safetensors __metadata__", "build_notes": notes, "load_notes": load_notes,
            "checkpoint_dtypes": sorted(set(dtypes.values())), "hf_text_config": tf}
    golden_for_model(model, M, tf, ids, ck, args.out or args.model, meta, prov, dense_model)


INIT_STD = [  # (regex on the HF parameter name, std or callable fan_in -> std)
    (r"(norm|layernorm)\.weight$", lambda fi: 0.1),
    (r"e_score_correction_bias$", lambda fi: 0.05),
    (r"embed_tokens\.weight$", lambda fi: 1.0),
    (r"\.gate\.weight$", lambda fi: 2.0 / math.sqrt(fi)),
    (r"(gate_up_proj|gate_proj|up_proj)(\.weight)?$", lambda fi: 2.5 / math.sqrt(fi)),
    (r"", lambda fi: 1.0 / math.sqrt(fi)),
]


def mode_hf_init(args):
    transformers, C, M = hf_modules()
    with open(args.hf_init) as f:
        cfg = json.load(f)
    tf, sc, _ = normalise_text_config(cfg["text_config"])
    model, notes = build_model(C, M, tf, cfg.get("vision_config"), cfg, seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    _, tm = text_model(model)
    tprefix = text_model(model)[0] + "."
    sd_names = set(model.state_dict().keys())
    for name, p in list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in sd_names]:
        if not (name.startswith(tprefix) or name.startswith("lm_head")) or name.endswith("inv_freq"):
            continue
        fan_in = p.shape[-1]
        std = next(fn(fan_in) for pat, fn in INIT_STD if re.search(pat, name))
        p.data.copy_(torch.randn(p.shape, generator=gen) * std)
    persistent = dict(model.named_parameters())
    persistent.update({n: b for n, b in model.named_buffers() if n in sd_names})  # not inv_freq
    for p in persistent.values():
        if p.dtype == torch.float32:
            p.data.copy_(p.data.to(torch.bfloat16).to(torch.float32))  # bf16-exact values
    os.makedirs(args.save, exist_ok=True)
    save_model = copy.deepcopy(model).to(torch.bfloat16)
    save_model.save_pretrained(args.save, safe_serialization=True)
    del save_model
    # reload through HF's own loader; the goldens come from the reloaded model
    reloaded = None
    try:
        Cls = M.MiniMaxM3SparseForConditionalGeneration
        try:
            reloaded = Cls.from_pretrained(args.save, dtype=torch.float32, attn_implementation="eager")
        except TypeError:
            reloaded = Cls.from_pretrained(args.save, torch_dtype=torch.float32, attn_implementation="eager")
        reloaded = reloaded.float().eval()
    except Exception as e:
        notes["reload_error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    from safetensors import safe_open
    names = {}
    for fn in sorted(os.listdir(args.save)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(args.save, fn), framework="pt") as f:
                for k in f.keys():
                    names[k] = str(f.get_slice(k).get_dtype()) + str(list(f.get_slice(k).get_shape()))
    # our checkpoint-name view of the saved file, for the independent re-implementation
    ck = None
    try:
        ck, _ = load_checkpoint_hf_layout(args.save, tf)
    except Exception as e:
        notes["hf_layout_reimpl_load_error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    ids, ids_desc = make_ids(args, tf["vocab_size"])
    use = model
    if reloaded is not None:
        a = run_hf(model, ids[:64], M, tf)["logits"]
        b = run_hf(reloaded, ids[:64], M, tf)["logits"]
        notes["reload_logits_max_abs_diff_vs_in_memory"] = float((a - b).abs().max())
        use = reloaded
    dense_model = make_dense_model(C, M, tf, cfg, ck, args.seed, notes) if ck is not None else None
    meta = common_meta(args, tf, "bf16 checkpoint (HF save_pretrained), fp32 compute", ids_desc, args.name or "tiny_hf_layout")
    meta["checkpoint_generator"] = SCRIPT + " --hf-init (save_pretrained)"
    prov = {"build_notes": notes, "hf_text_config": tf, "hf_init_config": args.hf_init,
            "saved_tensor_names": names}
    golden_for_model(use, M, tf, ids, ck, args.save, meta, prov, dense_model)


def load_checkpoint_hf_layout(d, tf):
    """Read an HF save_pretrained checkpoint and rename to our release names (for the re-implementation)."""
    raw, _ = load_checkpoint(d)
    out = {}
    for k, v in raw.items():
        n = k
        m = re.match(r"(language_model\.model\.layers\.(\d+)\.)(.*)$", n)
        if m:
            P, l, s = m.group(1), int(m.group(2)), m.group(3)
            if not tf["moe_layer_freq"][l]:
                s = re.sub(r"^(block_sparse_moe|mlp)\.(gate_proj|up_proj|down_proj)", r"mlp.\2", s)
            s = re.sub(r"^mlp\.(gate\.|experts\.|shared_experts\.|e_score)", r"block_sparse_moe.\1", s)
            s = s.replace("block_sparse_moe.gate.e_score_correction_bias", "block_sparse_moe.e_score_correction_bias")
            s = re.sub(r"^self_attn\.indexer\.(q_proj|k_proj|q_norm|k_norm)", r"self_attn.index_\1", s)
            n = P + s
        out[n] = v
    # split fused tensors if the file holds them
    for n in list(out):
        m = re.match(r"(.*)\.(mlp|shared_experts)\.gate_up_proj\.weight$", n)
        if m:
            g, u = out.pop(n).chunk(2, 0)
            out[f"{m.group(1)}.{m.group(2)}.gate_proj.weight"] = g
            out[f"{m.group(1)}.{m.group(2)}.up_proj.weight"] = u
        m = re.match(r"(.*)\.experts\.gate_up_proj$", n)
        if m:
            t = out.pop(n)
            for e in range(t.shape[0]):
                g, u = t[e].chunk(2, 0)
                out[f"{m.group(1)}.experts.{e}.w1.weight"] = g
                out[f"{m.group(1)}.experts.{e}.w3.weight"] = u
        m = re.match(r"(.*)\.experts\.down_proj$", n)
        if m:
            t = out.pop(n)
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.experts.{e}.w2.weight"] = t[e]
    return out, None


def mode_check_mxfp8(args):
    f32dir, mxdir = args.check_mxfp8
    from safetensors import safe_open
    res = {"tensors": 0, "code_mismatch": 0, "scale_not_minimal": 0, "bf16_mismatch": 0, "f32_mismatch": 0}
    with safe_open(os.path.join(f32dir, "model.safetensors"), framework="pt") as fa, \
            safe_open(os.path.join(mxdir, "model.safetensors"), framework="pt") as fb:
        keys_b = set(fb.keys())
        for k in fa.keys():
            w = fa.get_tensor(k)
            q = fb.get_tensor(k)
            res["tensors"] += 1
            if q.dtype == torch.float8_e4m3fn:
                s = fb.get_tensor(k + "_scale_inv").to(torch.float32)
                e = (s - 127.0).repeat_interleave(32, 1)
                ref = (w.double() / torch.exp2(e.double())).float().to(torch.float8_e4m3fn)
                bad = (ref.view(torch.uint8) != q.view(torch.uint8)).nonzero().tolist()
                res["code_mismatch"] += len(bad)
                for i, j in bad[:10]:
                    x = float(w[i, j].double() / torch.exp2(e[i, j].double()))
                    # scalar cast too: torch's vectorised and scalar CPU paths may round ties differently
                    scalar = torch.tensor([x], dtype=torch.float32)[0:1].to(torch.float8_e4m3fn).float().item()
                    res.setdefault("mismatches", []).append(
                        {"tensor": k, "row": i, "col": j, "scaled_value": x, "ours": float(q[i, j].float()),
                         "torch": float(ref[i, j].float()), "torch_single_element_cast": scalar})
                amax = w.abs().view(w.shape[0], -1, 32).amax(-1)
                ok = (amax / torch.exp2(s - 127.0) <= 448) & ((amax == 0) | (amax / torch.exp2(s - 128.0) > 448))
                res["scale_not_minimal"] += int((~ok).sum())
            elif q.dtype == torch.bfloat16:
                res["bf16_mismatch"] += int((w.to(torch.bfloat16).view(torch.int16) != q.view(torch.int16)).sum())
            else:
                res["f32_mismatch"] += int((w != q).sum())
        res["extra_tensors_in_mxfp8"] = len(keys_b) - res["tensors"]
    log("MXFP8 check:", json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint dir (released layout, from make_checkpoint.py)")
    ap.add_argument("--hf-init", help="flat HF config JSON: build a random HF model and save_pretrained it")
    ap.add_argument("--save", help="with --hf-init: output checkpoint dir (goldens go there too)")
    ap.add_argument("--check-mxfp8", nargs=2, metavar=("F32DIR", "MXDIR"))
    ap.add_argument("--ids", help="token ids file (JSON list or whitespace separated)")
    ap.add_argument("--ids-seed", type=int, default=1234)
    ap.add_argument("--T", type=int, default=448)
    ap.add_argument("--seed", type=int, default=0, help="model init seed (--hf-init) / recorded")
    ap.add_argument("--name", help="config name recorded in the metadata")
    ap.add_argument("--out", help="output dir for golden.safetensors (default: the checkpoint dir)")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers, C, M = hf_modules()
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, modeling {M.__file__}")
    if args.check_mxfp8:
        mode_check_mxfp8(args)
    elif args.hf_init:
        if not args.save:
            raise SystemExit("--hf-init needs --save DIR")
        mode_hf_init(args)
    elif args.model:
        mode_model(args)
    else:
        raise SystemExit("give --model, --hf-init or --check-mxfp8")


if __name__ == "__main__":
    main()
