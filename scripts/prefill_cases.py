#!/usr/bin/env python3
"""Writes the 128 benchmark prefill shapes of the MiniMax prefill workload manifest
(../shared/data/msa_prefill_workload, see its FORMAT.md) as one line each, for tools/bench_prefill_tc's
bench_prefill_cases, which runs on the device machine (where ../shared is not available: the list travels in the
git-ignored .gpucarry/ folder; it is generated, never committed).

Line: case_id weight tags batch q_lens p_lens   (weight = representative_weight, 0 for diagnostic cases;
tags joined by ','; q_lens / p_lens comma-separated per sequence).
  python3 scripts/prefill_cases.py [--data DIR] [--out FILE]      (default out: .gpucarry/prefill_cases.txt)
"""
import argparse
import hashlib
import json
import os
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--data", default=os.path.join(root, "..", "shared", "data", "msa_prefill_workload"))
ap.add_argument("--out", default=os.path.join(root, ".gpucarry", "prefill_cases.txt"))
a = ap.parse_args()

meta = json.load(open(os.path.join(a.data, "prefill_cases_v1.meta.json")))
bench = json.load(open(os.path.join(a.data, "prefill_benchmark_cases_v1.json")))
want = {c["case_id"]: c for c in bench["cases"]}
shapes = {}
for shard in meta["manifest_shards"]:  # {file, sha256, case_count}, read in file-name order
    path = os.path.join(a.data, shard["file"])
    data = open(path, "rb").read()
    if hashlib.sha256(data).hexdigest() != shard["sha256"]:
        sys.exit(f"prefill_cases: {path}: sha256 differs from meta.json")
    for line in data.decode().splitlines():
        c = json.loads(line)
        if c["case_id"] in want:
            shapes[c["case_id"]] = c
missing = [k for k in want if k not in shapes]
if missing:
    sys.exit(f"prefill_cases: {len(missing)} benchmark cases not in the manifest, e.g. {missing[0]}")
os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
with open(a.out, "w") as f:
    for cid, b in want.items():
        s = shapes[cid]
        f.write(f"{cid} {b.get('representative_weight', 0)} {','.join(b['tags'])} {s['batch_size']} "
                f"{','.join(map(str, s['query_lens']))} {','.join(map(str, s['prefix_lens']))}\n")
print(f"prefill_cases: {len(want)} cases → {a.out}")
