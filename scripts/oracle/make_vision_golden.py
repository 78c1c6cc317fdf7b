#!/usr/bin/env python3
"""Vision golden fixture (issue 12 item 4): a tiny random MiniMax-M3 VL model from HF transformers 5.17
(`minimax_m3_vl`), its checkpoint and HF's outputs for one image in a prompt.

Runs where torch + transformers 5.17 are installed (the H200 machine), on the CPU, fp32, eager; no network.

  python3 scripts/oracle/make_vision_golden.py --config tests/golden/configs/tiny_vl.hf.json \
      --out tests/golden/fixtures/tiny_vl [--dump DIR]

Writes OUT/config.json + model.safetensors (HF save_pretrained, bf16), OUT/golden.safetensors, OUT/provenance.json.
The text part is built and initialised exactly like `make_golden.py --hf-init` (same INIT_STD, same seed); the vision
tower, projector and merge MLP get non-trivial random values (LayerNorm weights ≠ 1, biases ≠ 0) so every op matters.

golden.safetensors (all F32 unless noted):
  pixel_values [R, 1176] and image_grid_thw I32 [1, 3]: image A, from the HF image processor on a synthetic picture
  input_ids I32 [T]: text, ]<]start of image[>[ stand-in, N slot ids (= image_token_index), end stand-in, text
  vision.patch_embed [R, Dv], vision.pre_ln [R, Dv], vision.layer.{i} [R, Dv] (encoder layer outputs),
  vision.projected [R, H] (multi_modal_projector linear_2 output, per patch), vision.embeds [N, H] (merge output:
  what replaces the slot rows), inputs_embeds [T, H] (what the text model got), logits [T, V]
  b.pixel_values / b.image_grid_thw / b.embeds: image B (another size), vision only
--dump DIR also copies the installed modeling / configuration source there, for reading.
"""

import argparse
import copy
import datetime
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import sys
import traceback

import numpy as np
import torch

torch.set_grad_enabled(False)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as G  # noqa: E402

SCRIPT = "scripts/oracle/make_vision_golden.py"


def log(*a):
    print(*a, flush=True)


def synthetic_image(h, w, seed):
    """Smooth gradients plus noise (uint8 HWC): the same formula is not needed on our side (pixels are stored)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1)
    noise = rng.integers(-40, 41, size=(h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def hf_pixels(img, info):
    """pixel_values [R, 1176] and grid [1, 3] from the HF image processor (fallback: random, recorded)."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import make_media_fixtures as MF
        img_cls, _, pinfo = MF.find_hf_processors()
        info["processor"] = pinfo
        proc = img_cls()
        from PIL import Image
        try:
            r = proc(images=[Image.fromarray(img)], return_tensors="pt", device="cpu")
        except TypeError:
            r = proc(images=[Image.fromarray(img)], return_tensors="pt")
        return r["pixel_values"].float(), r["image_grid_thw"].to(torch.int64)
    except Exception as e:
        info.setdefault("processor_errors", []).append(f"{type(e).__name__}: {e}")
        traceback.print_exc()
        h, w = img.shape[0] // 14, img.shape[1] // 14
        g = torch.Generator().manual_seed(7)
        return torch.randn(h * w, 1176, generator=g), torch.tensor([[1, h, w]])


def init_vision(model, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    n = 0
    for name, p in model.named_parameters():
        if not re.search(r"(vision|projector|patch_merge|merge_linear)", name):
            continue
        if name.endswith("bias"):
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        elif p.dim() == 1:  # LayerNorm weight
            p.data.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.2)
        else:
            fan_in = int(np.prod(p.shape[1:]))
            p.data.copy_(torch.randn(p.shape, generator=gen) * (1.5 / math.sqrt(fan_in)))
        n += 1
    return n


def find_vision_parts(model):
    parts = {}
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if "vision" in name.lower() and "VisionModel" in cls and "vision_model" not in parts:
            parts["vision_model"] = (name, mod)
        if re.search(r"(^|\.)(embeddings)$", name) and "vision" in name:
            parts["patch_embed"] = (name, mod)
        if re.search(r"pre_lay[e]?rnorm$", name):
            parts["pre_ln"] = (name, mod)
        m = re.search(r"vision.*layers\.(\d+)$", name)
        if m:
            parts[f"layer.{m.group(1)}"] = (name, mod)
        if re.search(r"multi_modal_projector\.linear_2$", name):
            parts["projected"] = (name, mod)
        if re.search(r"(merge_linear_2|patch_merge_mlp\.linear_2)$", name):
            parts["embeds"] = (name, mod)
    return parts


def capture(model, fn, parts, with_text=True):
    caps, hooks = {}, []
    for key, (name, mod) in parts.items():
        if key == "vision_model":
            continue
        hooks.append(mod.register_forward_hook(
            lambda m, a, out, key=key: caps.__setitem__(key, (out[0] if isinstance(out, tuple) else
                                                                getattr(out, "last_hidden_state", out)).detach().clone())))
    if with_text:
        tname, tm = G.text_model(model)

        def pre(m, args, kwargs):
            e = kwargs.get("inputs_embeds")
            if e is None and len(args) > 4:
                e = args[4]
            if e is not None:
                caps["inputs_embeds"] = e.detach().clone()
        hooks.append(tm.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        out = fn()
    finally:
        for h in hooks:
            h.remove()
    return out, caps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump", help="copy the HF minimax_m3_vl sources and a model description here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    transformers, C, M = G.hf_modules()
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, modeling {M.__file__}")
    info = {"errors": []}
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        d = os.path.dirname(M.__file__)
        for fn in os.listdir(d):
            if fn.endswith(".py"):
                shutil.copy(os.path.join(d, fn), os.path.join(args.dump, fn))

    with open(args.config) as f:
        cfg = json.load(f)
    tf, sc, _ = G.normalise_text_config(cfg["text_config"])
    model, notes = G.build_model(C, M, tf, cfg.get("vision_config"), cfg, seed=args.seed)
    info["build_notes"] = notes
    # text init exactly as make_golden.py --hf-init
    gen = torch.Generator().manual_seed(args.seed)
    tprefix = G.text_model(model)[0] + "."
    sd_names = set(model.state_dict().keys())
    for name, p in list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in sd_names]:
        if not (name.startswith(tprefix) or name.startswith("lm_head")) or name.endswith("inv_freq"):
            continue
        fan_in = p.shape[-1]
        std = next(fn(fan_in) for pat, fn in G.INIT_STD if re.search(pat, name))
        p.data.copy_(torch.randn(p.shape, generator=gen) * std)
    info["vision_params_initialised"] = init_vision(model, args.seed)
    for p in list(model.parameters()) + [b for n, b in model.named_buffers() if n in sd_names]:
        if p.dtype == torch.float32:
            p.data.copy_(p.data.to(torch.bfloat16).to(torch.float32))
    os.makedirs(args.out, exist_ok=True)
    sm = copy.deepcopy(model).to(torch.bfloat16)
    sm.save_pretrained(args.out, safe_serialization=True)
    del sm
    # m3serve's switch for the ViT rotary (docs/MEDIA.md "Rotary variants"): the fixture is HF's, so pin HF's
    # variant (m3serve's default is the official one). HF ignores the key.
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved.setdefault("vision_config", {})["vit_rope"] = "hf517"
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    use = model
    try:
        Cls = M.MiniMaxM3SparseForConditionalGeneration
        try:
            use = Cls.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager").float().eval()
        except TypeError:
            use = Cls.from_pretrained(args.out, torch_dtype=torch.float32, attn_implementation="eager").float().eval()
        diffs = [float((a - b).abs().max()) for (na, a), (nb, b) in
                 zip(sorted(model.state_dict().items()), sorted(use.state_dict().items()))]
        info["reload_max_param_diff"] = max(diffs) if diffs else None
    except Exception as e:
        info["errors"].append(f"reload: {type(e).__name__}: {e}")
        traceback.print_exc()
        use = model

    if args.dump:
        with open(os.path.join(args.dump, "modules.txt"), "w") as f:
            f.write(repr(use) + "\n\n")
            for n, p in use.state_dict().items():
                f.write(f"{n} {list(p.shape)} {p.dtype}\n")
            f.write("\nforward signature: " + str(inspect.signature(use.forward)) + "\n")
            for n in ("get_image_features", "get_video_features", "get_placeholder_mask"):
                for obj in (use, getattr(use, "model", None)):
                    if obj is not None and hasattr(obj, n):
                        f.write(f"{type(obj).__name__}.{n}{inspect.signature(getattr(obj, n))}\n")

    top = use.config
    img_id = int(getattr(top, "image_token_index", getattr(top, "image_token_id", cfg.get("image_token_index"))))
    info["image_token_index"] = img_id
    sig = set(inspect.signature(use.forward).parameters)
    grid_kw = next((k for k in ("image_grid_thw", "grid_thw", "image_grid", "image_sizes") if k in sig), None)
    info["grid_kw"] = grid_kw
    parts = find_vision_parts(use)
    info["captured_modules"] = {k: v[0] for k, v in parts.items()}
    log("parts:", info["captured_modules"])

    tensors = {}
    # image A in a prompt
    img_a = synthetic_image(84, 112, 1)
    pv, grid = hf_pixels(img_a, info)
    n_slots = int(grid.prod()) // 4
    rng = np.random.default_rng(4321)
    V = tf["vocab_size"]
    start_id, end_id = int(cfg.get("image_start_stand_in", 1002)), int(cfg.get("image_end_stand_in", 1003))
    ids = ([int(v) for v in rng.integers(0, 1000, 9)] + [start_id] + [img_id] * n_slots + [end_id] +
           [int(v) for v in rng.integers(0, 1000, 7)])
    ids_t = torch.tensor(ids, dtype=torch.int64)
    kw = {"input_ids": ids_t[None], "pixel_values": pv, "use_cache": False}
    if grid_kw:
        kw[grid_kw] = grid
    out, caps = capture(use, lambda: use(**kw), parts)
    tensors["input_ids"] = ids_t.to(torch.int32)
    tensors["pixel_values"] = pv.contiguous()
    tensors["image_grid_thw"] = grid.to(torch.int32)
    tensors["logits"] = out.logits[0].float()
    for k, v in caps.items():
        v = v.float()
        if v.dim() == 3 and v.shape[0] == 1:
            v = v[0]
        tensors[k if k == "inputs_embeds" else "vision." + k] = v.reshape(-1, v.shape[-1]).contiguous()
    # cross-check: embeds are the slot rows of inputs_embeds
    if "inputs_embeds" in tensors and "vision.embeds" in tensors:
        e = tensors["inputs_embeds"][ids_t == img_id]
        info["slot_rows_equal_embeds_max_abs"] = float((e - tensors["vision.embeds"]).abs().max())
    # text-only run of the same ids with the slot rows as plain embeddings: shows the image matters
    try:
        plain = use(input_ids=ids_t[None], use_cache=False).logits[0]
        info["logits_max_abs_diff_image_vs_no_image"] = float((plain - tensors["logits"]).abs().max())
    except Exception as e:
        info["errors"].append(f"text-only run: {type(e).__name__}: {e}")

    # image B: another size, vision path only
    try:
        img_b = synthetic_image(140, 56, 2)
        pvb, gridb = hf_pixels(img_b, info)
        fn = None
        for obj in (use, getattr(use, "model", None)):
            if obj is not None and hasattr(obj, "get_image_features"):
                fn = obj.get_image_features
                break
        _, capsb = capture(use, lambda: fn(pvb, gridb), parts, with_text=False)
        tensors["b.pixel_values"] = pvb.contiguous()
        tensors["b.image_grid_thw"] = gridb.to(torch.int32)
        for k in ("embeds", "layer.0"):
            if k in capsb:
                v = capsb[k].float()
                tensors["b." + k] = v.reshape(-1, v.shape[-1]).contiguous()
    except Exception as e:
        info["errors"].append(f"image B: {type(e).__name__}: {e}")
        traceback.print_exc()

    meta = {"script": SCRIPT, "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "modeling_source_sha256_16": G.source_hash(M),
            "date_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(sys.argv), "seed": str(args.seed), "compute": "fp32 CPU eager, bf16-exact weights"}
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(args.out, "golden.safetensors"),
              metadata=meta)
    info["tensors"] = {k: list(v.shape) for k, v in sorted(tensors.items())}
    info["meta"] = meta
    with open(os.path.join(args.out, "provenance.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
    log(json.dumps(info, indent=1, default=str))


if __name__ == "__main__":
    main()
