#!/usr/bin/env python3
"""Self-test of make_checkpoint.py (numpy only). Exit status 0 = pass.

Checks: E4M3 round-to-nearest-even against a brute-force search of the value table; MXFP8 scale choice and
dequantisation error bound; bf16 rounding; safetensors layout (8-byte aligned sorted header, contiguous
offsets); sharding index; determinism; and that the committed fixture checkpoints regenerate byte-identically.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import make_checkpoint as mc  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def test_e4m3_rne():
    vals = mc.E4M3_POS
    mids = (vals[:-1] + vals[1:]) / 2
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-448, 448, 20000), rng.uniform(-0.02, 0.02, 20000), mids, -mids, vals,
                        -vals, [0.0, -0.0, 2.0 ** -10, 3 * 2.0 ** -10, 448.0, -448.0]])
    codes = mc.f32_to_e4m3_bits(x)
    got = mc.e4m3_bits_to_f32(codes).astype(np.float64)
    a = np.abs(x)
    d = np.abs(vals[None, :] - a[:, None])
    best = d.min(1, keepdims=True)
    cand = d == best
    # ties: the even code (mantissa LSB 0)
    even = cand & ((np.arange(127) % 2) == 0)[None, :]
    pick = np.where(cand.sum(1) > 1, even.argmax(1), cand.argmax(1))
    check(np.array_equal(np.abs(got), vals[pick]), "E4M3 magnitude is round-to-nearest-even")
    check(np.array_equal(np.signbit(got), np.signbit(x)), "E4M3 keeps the sign (also of values rounding to 0)")
    check(mc.f32_to_e4m3_bits(np.array([124.0]))[0] == 0x70 and mc.f32_to_e4m3_bits(np.array([168.0]))[0] == 0x72,
          "E4M3 exact ties 124 -> 128 (0x70), 168 -> 160 (0x72)")
    check(np.isnan(mc.e4m3_bits_to_f32(np.array([0x7F, 0xFF], dtype=np.uint8))).all(), "0x7F/0xFF decode to NaN")


def test_mxfp8():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((64, 256)) * np.exp2(rng.integers(-20, 10, (64, 1)))).astype(np.float32)
    w[3, 32:64] = 0.0  # an all-zero block
    codes, scales = mc.mxfp8_quantize(w)
    check(codes.shape == (64, 256) and scales.shape == (64, 8) and scales.dtype == np.uint8, "MXFP8 shapes")
    amax = np.abs(w.astype(np.float64)).reshape(64, 8, 32).max(-1)
    e = scales.astype(np.float64) - 127
    nz = amax > 0
    check(np.all(amax[nz] / np.exp2(e[nz]) <= 448), "MXFP8 block absmax fits E4M3 after scaling")
    check(np.all(amax[nz] / np.exp2(e[nz] - 1) > 448), "MXFP8 scale exponent is the smallest that fits")
    deq = mc.mxfp8_dequantize(codes, scales)
    err = np.abs(deq.astype(np.float64) - w).reshape(64, 8, 32)
    # half an E4M3 ulp at the block's top binade (2^-3 relative) bounds the error; subnormals are finer
    check(np.all(err <= (amax * 2.0 ** -4)[..., None] + 1e-30), "MXFP8 dequant error <= 2^-4 * block absmax")
    check(np.all(deq[3, 32:64] == 0), "all-zero block dequantises to zero")


def test_bf16():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -3.14159, 1e-30], dtype=np.float32)
    b = mc.bf16_bits_to_f32(mc.f32_to_bf16_bits(x))
    check(b[0] == 1.0 and b[1] == 1.0 and b[2] == 1.0 + 2 ** -6, "bf16 ties to even")
    check(abs(b[3] + 3.140625) < 1e-6, "bf16 rounding of -pi")


def read_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n)
    return n, raw, json.loads(raw)


def test_writer_and_determinism(tmp):
    a = os.path.join(tmp, "a")
    b = os.path.join(tmp, "b")
    args = ["--preset", "tiny", "--dtype", "mxfp8", "--seed", "5"]
    mc.main(args + ["--out", a])
    mc.main(args + ["--out", b])
    fa, fb = os.path.join(a, "model.safetensors"), os.path.join(b, "model.safetensors")
    check(open(fa, "rb").read() == open(fb, "rb").read(), "same seed gives identical bytes")
    n, raw, hdr = read_header(fa)
    check(n % 8 == 0, "header length is a multiple of 8")
    meta = hdr.pop("__metadata__", {})
    check(meta.get("seed") == "5", "metadata records the seed")
    names = list(hdr)
    check(names == sorted(names), "header keys sorted")
    off = 0
    for k in sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0]):
        s, e = hdr[k]["data_offsets"]
        size = int(np.prod(hdr[k]["shape"])) * mc.ST_DTYPE_SIZE[hdr[k]["dtype"]]
        check(s == off and e - s == size, f"{k}: contiguous offsets and size")
        off = e
    check(os.path.getsize(fa) == 8 + n + off, "file size = header + data")
    cfg = json.load(open(os.path.join(a, "config.json")))
    qc = cfg.get("quantization_config", {})
    check(qc.get("quant_method") == "mxfp8" and qc.get("weight_block_size") == [1, 32], "quantization_config")
    t, _ = mc.read_safetensors(fa)
    g = "language_model.model.layers.3.block_sparse_moe."
    check(t[g + "gate.weight"][0] == "F32" and t[g + "e_score_correction_bias"][0] == "F32", "router stays F32")
    check(np.abs(t[g + "e_score_correction_bias"][1]).min() > 0, "correction bias non-zero")
    check(t["language_model.lm_head.weight"][0] == "BF16", "lm_head unquantised")
    check(t[g + "experts.0.w1.weight"][0] == "F8_E4M3" and t[g + "experts.0.w1.weight_scale_inv"][1].shape == (64, 4),
          "expert weight MXFP8 + scale")
    # f32 and mxfp8 of one seed are the same model
    c = os.path.join(tmp, "c")
    mc.main(["--preset", "tiny", "--dtype", "f32", "--seed", "5", "--out", c])
    t32, _ = mc.read_safetensors(os.path.join(c, "model.safetensors"))
    n1 = "language_model.model.layers.0.self_attn.q_proj.weight"
    deq = mc.mxfp8_dequantize(t[n1][1], t[n1 + "_scale_inv"][1])
    check(np.abs(deq - t32[n1][1]).max() <= np.abs(t32[n1][1]).max() * 2 ** -4, "mxfp8 is a rounding of the f32 model")
    # sharding
    d = os.path.join(tmp, "d")
    mc.main(["--preset", "tiny", "--dtype", "bf16", "--seed", "5", "--shard-mb", "1", "--out", d])
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    files = sorted(set(idx["weight_map"].values()))
    check(len(files) >= 2, "sharded into several files")
    seen = {}
    for fn in files:
        ts, _ = mc.read_safetensors(os.path.join(d, fn))
        for k in ts:
            seen[k] = fn
    check(seen == idx["weight_map"], "index weight_map matches the shards")
    check(idx["metadata"]["total_size"] == sum(
        int(np.prod(a.shape)) * mc.ST_DTYPE_SIZE[dt] for fn in files for dt, a in mc.read_safetensors(os.path.join(d, fn))[0].values()),
        "index total_size")


def test_vision_weights(tmp):
    e = os.path.join(tmp, "e")
    mc.main(["--preset", "tiny", "--dtype", "mxfp8", "--seed", "5", "--vision-weights", "--out", e])
    t, _ = mc.read_safetensors(os.path.join(e, "model.safetensors"))
    v = "vision_tower.vision_model."
    check(t[v + "embeddings.patch_embedding.weight"][0] == "F32" and
          t[v + "embeddings.patch_embedding.weight"][1].shape == (48, 3, 2, 14, 14), "patch embedding F32 [D,3,2,14,14]")
    ln = mc.bf16_bits_to_f32(t[v + "encoder.layers.0.layer_norm1.weight"][1])
    check(abs(float(ln.mean()) - 1) < 0.3 and ln.std() > 0, "LayerNorm weights 1-centred, not constant")
    check(t[v + "encoder.layers.0.mlp.fc1.weight"][0] == "BF16" and t[v + "encoder.layers.0.mlp.fc1.weight"][1].shape == (96, 48),
          "vision MLP unquantised")
    check(t["patch_merge_mlp.linear_1.weight"][1].shape == (64, 4 * 128), "merge MLP takes 4 text-width rows")
    check(t["multi_modal_projector.linear_2.weight"][1].shape == (128, 64), "projector ends at the text width")
    check(not any(k.endswith("_scale_inv") and ("vision" in k or "projector" in k or "merge" in k) for k in t),
          "no vision tensor quantised")
    f = os.path.join(tmp, "f")
    mc.main(["--preset", "tiny", "--dtype", "mxfp8", "--seed", "5", "--out", f])
    tf, _ = mc.read_safetensors(os.path.join(f, "model.safetensors"))
    check(all(np.array_equal(tf[k][1], t[k][1]) for k in tf), "text tensors unchanged by --vision-weights")


def test_fixtures_regenerate(tmp):
    fix = os.path.join(REPO, "tests", "golden", "fixtures")
    cfg = os.path.join(REPO, "tests", "golden", "configs", "tiny_sparse.json")
    for name, extra in (("tiny_sparse_f32", ["--dtype", "f32"]), ("tiny_sparse_mxfp8", ["--dtype", "mxfp8", "--base-dtype", "bf16"])):
        ref = os.path.join(fix, name, "model.safetensors")
        if not os.path.exists(ref):
            continue
        out = os.path.join(tmp, name)
        mc.main(["--config", cfg, "--seed", "1", "--out", out] + extra)
        h1 = hashlib.sha256(open(ref, "rb").read()).hexdigest()
        h2 = hashlib.sha256(open(os.path.join(out, "model.safetensors"), "rb").read()).hexdigest()
        check(h1 == h2, f"{name}: committed checkpoint regenerates byte-identically (numpy {np.__version__})")


def main():
    test_e4m3_rne()
    test_mxfp8()
    test_bf16()
    with tempfile.TemporaryDirectory() as tmp:
        test_writer_and_determinism(tmp)
        test_vision_weights(tmp)
        test_fixtures_regenerate(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checkpoint tool checks passed")


if __name__ == "__main__":
    main()
