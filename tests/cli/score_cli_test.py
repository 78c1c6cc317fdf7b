#!/usr/bin/env python3
"""`m3serve score` end to end: its JSON must agree with the HF golden fixture (top-20 logits per position,
selected block sets per sparse layer and KV head), and must not depend on --chunk.
Usage: score_cli_test.py M3SERVE_BINARY FIXTURE_DIR"""
import json
import struct
import subprocess
import sys
import tempfile

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "I32": np.int32}.get(e["dtype"])
        if dt is None:
            continue
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(data[b:en], dtype=dt).reshape(e["shape"])
    return out


def score(binary, fixture, ids, chunk):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as idf:
        json.dump(ids, idf)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        pass
    subprocess.run([binary, "score", "--model", fixture, "--ids-file", idf.name, "--out", out.name,
                    "--chunk", str(chunk)], check=True)
    with open(out.name) as f:
        return json.load(f)


def main():
    binary, fixture = sys.argv[1], sys.argv[2]
    gold = read_safetensors(f"{fixture}/golden.safetensors")
    ids = gold["input_ids"].tolist()
    a = score(binary, fixture, ids, 0)
    b = score(binary, fixture, ids, 100)
    assert a["logits"] == b["logits"] and a["selections"] == b["selections"], "score depends on --chunk"
    logits = gold["logits"]
    failures = 0
    for t, row in enumerate(a["logits"]):
        assert len(row) == 20
        ref = logits[t]
        scale = max(1.0, float(np.abs(ref).max()))
        for tok, val in row:
            if abs(val - float(ref[tok])) > 1e-4 * scale:
                failures += 1
        # The reported ids are the reference's top 20 unless two logits are within tolerance of the cut.
        ref_top = set(np.argsort(-ref, kind="stable")[:20].tolist())
        got = {tok for tok, _ in row}
        cut = np.sort(ref)[-20]
        for tok in got ^ ref_top:
            if abs(float(ref[tok]) - cut) > 1e-4 * scale:
                failures += 1
    for layer, heads in a["selections"].items():
        ref = gold[f"selection.{layer}"]
        for h, rows in enumerate(heads):
            for t, sel in enumerate(rows):
                assert sel[-1] == t // 16, f"layer {layer} head {h} pos {t}: local block not last"
                if set(sel) != {x for x in ref[h][t].tolist() if x >= 0}:
                    failures += 1
    print(f"score CLI vs golden: {len(a['logits'])} positions, {len(a['selections'])} sparse layers, "
          f"{failures} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
