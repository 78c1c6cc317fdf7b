#!/usr/bin/env python3
"""Media preprocessing fixtures for m3serve from HF transformers' minimax_m3_vl image/video processors.

Runs where torch + torchvision + transformers (with models/minimax_m3_vl) + PIL + numpy are installed; no network.
Usage: python3 scripts/oracle/make_media_fixtures.py --out DIR [--photos tests/media/photos]

Writes four files into DIR (copy the first three into tests/media/fixtures/):
  media_fixtures.json  cases, grids, token counts, checksums, provenance, HF throughput
  media_rows.f32       sampled rows of pixel_values (float32 little endian, 1176 per row), offsets in the json
  media_files.tar      small encoded files made here with PIL (colour modes, GIF, BMP, WebP, JPEG) for decoder parity
  log.txt              what ran

Synthetic inputs are generated from an integer formula that tests/media/media_fixture_test.cpp repeats (see gen_image),
so only outputs are stored. A whole pixel_values tensor is summarised by an order-sensitive checksum of its float32 bit
patterns (checksum below) plus a float64 sum, and a few rows are stored raw for a readable diff (docs/MEDIA.md §Parity).
"""

import argparse
import io
import json
import math
import os
import sys
import tarfile
import time
import traceback

import numpy as np

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


# --------------------------------------------------------------------------------------------------
# Shared with the C++ test (tests/media/media_fixture_test.cpp): keep both in step.
# --------------------------------------------------------------------------------------------------
M32 = np.uint64(0xFFFFFFFF)


def lowbias32(x):
    x = x.astype(np.uint64) & M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & M32
    x ^= x >> np.uint64(16)
    return x


def checksum(a):
    """sum_i a_i * (lowbias32(i) | 1) mod 2^64, a_i = the bytes (uint8) or the float32 bit patterns (uint32)."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.float32:
        v = a.reshape(-1).view(np.uint32).astype(np.uint64)
    else:
        assert a.dtype == np.uint8
        v = a.reshape(-1).astype(np.uint64)
    total = np.uint64(0)
    step = 1 << 22
    with np.errstate(over="ignore"):
        for s in range(0, v.size, step):
            idx = np.arange(s, min(s + step, v.size), dtype=np.uint64)
            w = lowbias32(idx) | np.uint64(1)
            total = total + np.sum(v[s:s + step] * w, dtype=np.uint64)
    return int(total)


def gen_image(h, w, seed, kind):
    """uint8 [h, w, 3]. noise: lowbias32(i ^ seed*0x9E3779B9) >> 24; grad: (7x + 13y + 85c + (hash >> 29)) & 255.
    Then row 0 and column 0 are 255, the last row and column 0 (in that order), which saturates both passes."""
    n = h * w * 3
    i = np.arange(n, dtype=np.uint64)
    mix = np.uint64((seed * 0x9E3779B9) & 0xFFFFFFFF)
    hsh = lowbias32(i ^ mix)
    if kind == "noise":
        v = (hsh >> np.uint64(24)).astype(np.uint8)
    else:
        c = i % np.uint64(3)
        x = (i // np.uint64(3)) % np.uint64(w)
        y = i // np.uint64(3 * w)
        v = ((np.uint64(7) * x + np.uint64(13) * y + np.uint64(85) * c + (hsh >> np.uint64(29))) & np.uint64(255)).astype(
            np.uint8)
    img = v.reshape(h, w, 3).copy()
    img[0, :, :] = 255
    img[:, 0, :] = 255
    img[h - 1, :, :] = 0
    img[:, w - 1, :] = 0
    return img


IMAGE_CASES = [
    # name, h, w, kind, seed
    ("tie_42x70", 42, 70, "noise", 1),
    ("tie_238x350", 238, 350, "noise", 2),
    ("tie_406x630", 406, 630, "grad", 3),
    ("side14_14x300", 14, 300, "noise", 4),
    ("sub14_10x2000", 10, 2000, "noise", 5),
    ("sub14_13x1000", 13, 1000, "grad", 6),
    ("thin_1x200", 1, 200, "noise", 7),
    ("reject_2x401", 2, 401, "noise", 8),
    ("reject_1x5000", 1, 5000, "noise", 9),
    ("one_1x1", 1, 1, "noise", 10),
    ("floor_176x2816", 176, 2816, "grad", 11),
    ("identity_224x224", 224, 224, "noise", 12),
    ("onepass_224x230", 224, 230, "noise", 13),
    ("onepass_300x224", 300, 224, "noise", 14),
    ("up_20x20", 20, 20, "noise", 15),
    ("mixed_100x30", 100, 30, "noise", 16),
    ("mixed_37x501", 37, 501, "grad", 17),
    ("odd_333x777", 333, 777, "noise", 18),
    ("odd_601x599", 601, 599, "grad", 19),
    ("cam_768x1024", 768, 1024, "grad", 20),
    ("sq_512x512", 512, 512, "noise", 21),
    ("sq_1000x1000", 1000, 1000, "grad", 22),
    ("hd_1080x1920", 1080, 1920, "noise", 23),
    ("uhd_2160x3840", 2160, 3840, "noise", 24),
    ("tall_3000x100", 3000, 100, "grad", 25),
]

VIDEO_CASES = [
    # name, frames, h, w, kind, seed
    ("v1_100x150", 1, 100, 150, "noise", 31),
    ("v3_90x160", 3, 90, 160, "grad", 32),
    ("v5_64x64", 5, 64, 64, "noise", 33),
    ("v10_64x92", 10, 64, 92, "noise", 34),
    ("v2_720x1280", 2, 720, 1280, "grad", 35),
]

ROWS_PER_CASE = 4


# --------------------------------------------------------------------------------------------------
# HF processors
# --------------------------------------------------------------------------------------------------
def find_hf_processors():
    import importlib
    import pkgutil
    info = {}
    img_cls = vid_cls = None
    try:
        pkg = importlib.import_module("transformers.models.minimax_m3_vl")
        for m in pkgutil.iter_modules(pkg.__path__):
            if "process" not in m.name:
                continue
            try:
                mod = importlib.import_module(f"transformers.models.minimax_m3_vl.{m.name}")
            except Exception as e:  # optional backends
                info.setdefault("import_errors", []).append(f"{m.name}: {e}")
                continue
            for name in dir(mod):
                obj = getattr(mod, name)
                if not isinstance(obj, type) or "MiniMax" not in name:
                    continue
                if name.endswith("ImageProcessorFast") or (name.endswith("ImageProcessor") and img_cls is None):
                    img_cls = obj
                if name.endswith("VideoProcessor"):
                    vid_cls = obj
    except Exception as e:
        info["m3_import_error"] = repr(e)
    if img_cls is None:
        from transformers import Qwen2VLImageProcessor as img_cls  # noqa: N813
        info["image_fallback"] = "Qwen2VLImageProcessor configured per docs M3_MODEL.md 5.1"
    if vid_cls is None:
        from transformers import Qwen2VLVideoProcessor as vid_cls  # noqa: N813
        info["video_fallback"] = "Qwen2VLVideoProcessor configured per docs M3_MODEL.md 5.3"
    info["image_class"] = f"{img_cls.__module__}.{img_cls.__name__}"
    info["video_class"] = f"{vid_cls.__module__}.{vid_cls.__name__}"
    return img_cls, vid_cls, info


CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def make_processor(cls, fallback, min_pixels, max_pixels):
    if fallback:
        try:
            return cls(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, temporal_patch_size=2,
                       merge_size=2, image_mean=CLIP_MEAN, image_std=CLIP_STD)
        except TypeError:
            return cls(size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, patch_size=14,
                       temporal_patch_size=2, merge_size=2, image_mean=CLIP_MEAN, image_std=CLIP_STD)
    return cls()


def describe(proc):
    d = {}
    for k in ["min_pixels", "max_pixels", "size", "patch_size", "temporal_patch_size", "merge_size", "image_mean",
              "image_std", "resample", "do_resize", "do_rescale", "rescale_factor", "do_normalize",
              "do_convert_rgb", "do_sample_frames", "fps", "min_frames", "max_frames"]:
        if hasattr(proc, k):
            v = getattr(proc, k)
            try:
                json.dumps(v)
                d[k] = v
            except TypeError:
                d[k] = repr(v)
    return d


def effective_pixels(proc, dmin, dmax):
    size = getattr(proc, "size", None)
    mn = getattr(proc, "min_pixels", None)
    mx = getattr(proc, "max_pixels", None)
    if isinstance(size, dict) and "shortest_edge" in size and "longest_edge" in size:
        mn, mx = size["shortest_edge"], size["longest_edge"]
    elif hasattr(size, "shortest_edge") and getattr(size, "shortest_edge", None):
        mn, mx = size.shortest_edge, size.longest_edge
    return int(mn or dmin), int(mx or dmax)


def to_np(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


class Out:
    def __init__(self):
        self.rows = []
        self.nrows = 0

    def summarise(self, pv, grid):
        pv = np.ascontiguousarray(to_np(pv), dtype=np.float32)
        assert pv.ndim == 2 and pv.shape[1] == 1176, pv.shape
        n = pv.shape[0]
        idx = sorted(set(int(round(k * (n - 1) / max(1, ROWS_PER_CASE - 1))) for k in range(ROWS_PER_CASE)))
        off = self.nrows
        for r in idx:
            self.rows.append(pv[r])
        self.nrows += len(idx)
        return {
            "grid_thw": [int(v) for v in to_np(grid).reshape(-1)],
            "rows": n,
            "tokens": n // 4,
            "checksum": str(checksum(pv)),
            "sum": float(pv.astype(np.float64).sum()),
            "min": float(pv.min()),
            "max": float(pv.max()),
            "sample_rows": idx,
            "sample_offset": off,
        }


def run_image(proc, img, out):
    import torch  # noqa: F401
    kw = {"return_tensors": "pt"}
    try:
        r = proc(images=[img], device="cpu", **kw)
    except TypeError:
        r = proc(images=[img], **kw)
    return out.summarise(r["pixel_values"], r["image_grid_thw"])


def run_video(proc, frames, out, mn, mx):
    kw = {"return_tensors": "pt", "do_resize": True, "do_sample_frames": False}
    r = None
    errs = []
    for extra in ({"device": "cpu", "size": {"shortest_edge": mn, "longest_edge": mx}},
                  {"device": "cpu", "min_pixels": mn, "max_pixels": mx}, {"device": "cpu"}, {}):
        try:
            r = proc(videos=[frames], **kw, **extra)
            break
        except Exception as e:  # kwargs differ between versions
            errs.append(f"{extra}: {e!r}")
    if r is None:
        raise RuntimeError("; ".join(errs))
    return out.summarise(r["pixel_values_videos"], r["video_grid_thw"])


def tv_resize_checksum(img, th, tw):
    """Independent check: torchvision's uint8 antialiased bicubic on the same input (docs M3_MODEL.md 5.1.3)."""
    import torch
    from torchvision.transforms.v2 import functional as F
    from torchvision.transforms import InterpolationMode
    t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).contiguous()
    if (th, tw) != tuple(t.shape[1:]):
        t = F.resize(t, [th, tw], interpolation=InterpolationMode.BICUBIC, antialias=True)
    return checksum(t.permute(1, 2, 0).contiguous().numpy())


def smart_resize(h, w, mn, mx, factor=28):
    if max(h, w) / min(h, w) > 200:
        raise ValueError("aspect")
    hb = round(h / factor) * factor
    wb = round(w / factor) * factor
    if hb * wb > mx:
        beta = math.sqrt((h * w) / mx)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < mn:
        beta = math.sqrt(mn / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
    return hb, wb


def pil_files(photos_dir):
    """Encoded test files: (name, bytes). Made with PIL so the decoder comparison is against PIL's own decode."""
    from PIL import Image
    files = []
    h, w = 45, 61
    rgb = gen_image(h, w, 41, "grad")

    def save(name, im, fmt, **kw):
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        files.append((name, b.getvalue()))

    base = Image.fromarray(rgb, "RGB")
    a = (lowbias32(np.arange(h * w, dtype=np.uint64)) >> np.uint64(24)).astype(np.uint8).reshape(h, w)
    a[:, :10] = 0  # alpha 0 over non-zero RGB: must keep the RGB (HF drops alpha)
    rgba = np.dstack([rgb, a])
    save("rgba.png", Image.fromarray(rgba, "RGBA"), "PNG")
    save("la.png", Image.fromarray(np.ascontiguousarray(np.dstack([rgb[:, :, 0], a])), "LA"), "PNG")
    save("l.png", Image.fromarray(np.ascontiguousarray(rgb[:, :, 1]), "L"), "PNG")
    g16 = (rgb[:, :, 0].astype(np.uint16) * 3 + rgb[:, :, 2].astype(np.uint16)).astype(np.uint16)  # 0..1020
    save("i16.png", Image.fromarray(np.ascontiguousarray(g16)), "PNG")
    save("one_bit.png", base.convert("1"), "PNG")
    p = base.quantize(colors=37)
    save("p.png", p, "PNG")
    save("p_trns.png", p, "PNG", transparency=5)
    save("rgb.bmp", base, "BMP")
    save("rgb.gif", p, "GIF")
    frames = [p, Image.fromarray(255 - rgb, "RGB").quantize(colors=17)]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    files.append(("anim.gif", b.getvalue()))
    save("lossless.webp", base, "WEBP", lossless=True)
    save("rgba_lossless.webp", Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True)
    save("lossy.webp", base, "WEBP", quality=80)
    save("q90_420.jpg", base, "JPEG", quality=90)
    save("q95_444.jpg", base, "JPEG", quality=95, subsampling=0)
    save("gray.jpg", base.convert("L"), "JPEG", quality=90)
    save("cmyk.jpg", base.convert("CMYK"), "JPEG", quality=90)
    save("progressive.jpg", base, "JPEG", quality=85, progressive=True)
    # 16-bit RGB PNG: PIL writes it from raw big-endian data.
    import zlib
    import struct
    raw16 = (rgb.astype(">u2") * 257 + (np.arange(h * w * 3).reshape(h, w, 3) % 200).astype(">u2")).astype(">u2")
    rows = b"".join(b"\x00" + raw16[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) + chunk(
        b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    files.append(("rgb16.png", png))
    if photos_dir and os.path.isdir(photos_dir):
        for n in sorted(os.listdir(photos_dir)):
            with open(os.path.join(photos_dir, n), "rb") as f:
                files.append(("photo_" + n, f.read()))
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--photos", default="tests/media/photos")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    import torch
    torch.set_num_threads(1)
    import transformers
    from PIL import Image
    import PIL
    import torchvision

    img_cls, vid_cls, info = find_hf_processors()
    prov = {"script": "scripts/oracle/make_media_fixtures.py", "transformers": transformers.__version__,
            "torch": torch.__version__, "torchvision": torchvision.__version__, "PIL": PIL.__version__,
            "numpy": np.__version__, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **info}
    log(json.dumps(prov))
    ip = make_processor(img_cls, "image_fallback" in info, 3136, 451584)
    vp = make_processor(vid_cls, "video_fallback" in info, 3136, 602112)
    prov["image_processor"] = describe(ip)
    prov["video_processor"] = describe(vp)
    imn, imx = effective_pixels(ip, 3136, 451584)
    vmn, vmx = 3136, 602112
    prov["image_min_max_pixels"] = [imn, imx]
    prov["video_min_max_pixels"] = [vmn, vmx]
    out = Out()
    res = {"provenance": prov, "checksum": "sum_i v_i*(lowbias32(i)|1) mod 2^64", "images": [], "videos": [],
           "files": [], "timestamps": [], "bench": {}}

    for name, h, w, kind, seed in IMAGE_CASES:
        c = {"name": name, "h": h, "w": w, "kind": kind, "seed": seed}
        img = gen_image(h, w, seed, kind)
        c["input_checksum"] = str(checksum(img))
        try:
            c.update(run_image(ip, img, out))
        except Exception as e:
            c["error"] = repr(e)[:300]
        try:
            th, tw = smart_resize(h, w, imn, imx)
            c["py_resized"] = [th, tw]
            if th > 0 and tw > 0:
                c["tv_resized_checksum"] = str(tv_resize_checksum(img, th, tw))
        except Exception as e:
            c["py_error"] = repr(e)[:200]
        log(name, {k: c.get(k) for k in ("grid_thw", "tokens", "error", "py_resized")})
        res["images"].append(c)

    for name, nf, h, w, kind, seed in VIDEO_CASES:
        c = {"name": name, "frames": nf, "h": h, "w": w, "kind": kind, "seed": seed}
        frames = np.stack([gen_image(h, w, seed + 1000 * k, kind) for k in range(nf)])
        try:
            c.update(run_video(vp, frames, out, vmn, vmx))
        except Exception as e:
            c["error"] = repr(e)[:600]
        log(name, {k: c.get(k) for k in ("grid_thw", "tokens", "error")})
        res["videos"].append(c)

    # Decoder + colour conversion parity: PIL's decode → convert("RGB") (what HF does with a PIL input).
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w") as tf:
        for fname, data in pil_files(args.photos):
            c = {"file": fname, "bytes": len(data)}
            if not fname.startswith("photo_"):
                ti = tarfile.TarInfo(fname)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            try:
                im = Image.open(io.BytesIO(data))
                c["pil_mode"] = im.mode
                c["pil_format"] = im.format
                im.load()
                rgb = np.asarray(im.convert("RGB"))
                c["decoded_hw"] = [int(rgb.shape[0]), int(rgb.shape[1])]
                c["decoded_checksum"] = str(checksum(rgb))
                c.update(run_image(ip, im, out))
            except Exception as e:
                c["error"] = repr(e)[:300]
            log(fname, {k: c.get(k) for k in ("pil_mode", "decoded_hw", "grid_thw", "error")})
            res["files"].append(c)

    # Timestamps: f"{ts:.1f}" of index / fps in double (what m3serve computes) and float32 (HF self-sampled).
    pairs = [(3, 20.0), (1, 4.0), (3, 4.0), (5, 4.0), (0, 1.0), (1, 30000 / 1001), (31, 30000 / 1001),
             (299, 30000 / 1001), (7, 25.0), (25, 24.0), (1, 40.0), (3, 40.0)]
    rng = np.random.default_rng(5)
    for _ in range(60):
        pairs.append((int(rng.integers(0, 20000)), float(rng.choice([1.0, 2.0, 4.0, 8.0, 20.0, 24.0, 25.0, 29.97,
                                                                     30.0, 30000 / 1001, 50.0, 60.0, 120.0]))))
    for idx, fps in pairs:
        res["timestamps"].append({"index": idx, "fps": fps, "double": f"{idx / fps:.1f}",
                                  "float32": f"{float(np.float32(idx) / np.float32(fps)):.1f}"})

    # HF throughput per core (torch threads = 1) on decoded uint8 frames, and with a PIL JPEG decode in front.
    for label, (h, w) in {"1080p": (1080, 1920), "4k": (2160, 3840)}.items():
        img = gen_image(h, w, 99, "grad")
        b = io.BytesIO()
        Image.fromarray(img).save(b, "JPEG", quality=90)
        jpg = b.getvalue()
        n = 12 if label == "1080p" else 5
        run_image(ip, img, Out())
        t = time.perf_counter()
        for _ in range(n):
            run_image(ip, img, Out())
        dt = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for _ in range(n):
            run_image(ip, Image.open(io.BytesIO(jpg)), Out())
        dtj = (time.perf_counter() - t) / n
        res["bench"][label] = {"hf_img_per_s_decoded": 1 / dt, "hf_img_per_s_with_pil_jpeg": 1 / dtj,
                               "jpeg_bytes": len(jpg), "torch_threads": torch.get_num_threads(), "iters": n}
        log("bench", label, res["bench"][label])

    res["rows_total"] = out.nrows
    with open(os.path.join(args.out, "media_rows.f32"), "wb") as f:
        for r in out.rows:
            f.write(np.asarray(r, dtype="<f4").tobytes())
    with open(os.path.join(args.out, "media_fixtures.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "media_files.tar"), "wb") as f:
        f.write(tar_buf.getvalue())
    log(f"done in {time.time() - t0:.1f}s, {out.nrows} rows")
    with open(os.path.join(args.out, "log.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
