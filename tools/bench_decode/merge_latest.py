#!/usr/bin/env python3
"""Merge bench_decode's markdown result rows (`--fp8` tables) into bench/results/msa_latest.json.

A row `| op | shape | cache | launch | median µs | CV | GB/s | % of copy | ... |` becomes the record (op, shape,
variant = "<cache> sm90a <launch> rotated"); an existing record with the same key is replaced, new keys are
appended. Only the rows of the given outputs are touched.

Usage: merge_latest.py --commit C --date YYYY-MM-DD --source bench/results/FILE.md OUTPUT.txt [OUTPUT.txt ...]
(Python 3 standard library only.)
"""
import argparse
import json
import re

ROW = re.compile(r"^\| (msa_decode_index|paged_decode_tc) \| ([^|]+) \| (bf16|e4m3) \| (graph(?:\+PDL)?) \| "
                 r"([0-9.]+) \| ([0-9.]+)% \| ([0-9]+) \| ([0-9]+)% \|")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--latest", default="bench/results/msa_latest.json")
    ap.add_argument("outputs", nargs="+")
    a = ap.parse_args()
    with open(a.latest) as f:
        latest = json.load(f)
    recs = latest["records"]
    index = {(r["op"], r["shape"], r["variant"]): i for i, r in enumerate(recs)}
    added = replaced = 0
    for path in a.outputs:
        with open(path) as f:
            for line in f:
                m = ROW.match(line)
                if not m:
                    continue
                op, shape, cache, launch, med, cv, gbps, pct = m.groups()
                r = {"op": op, "shape": shape.strip(), "variant": f"{cache} sm90a {launch} rotated",
                     "median_us": float(med), "gbps": int(gbps), "pct_copy": float(pct),
                     "cv": round(float(cv) / 100, 4), "commit": a.commit, "gpu": "NVIDIA H200", "date": a.date,
                     "source": a.source}
                key = (r["op"], r["shape"], r["variant"])
                if key in index:
                    recs[index[key]] = r
                    replaced += 1
                else:
                    index[key] = len(recs)
                    recs.append(r)
                    added += 1
    with open(a.latest, "w") as f:  # the file's layout: one record per line
        f.write("{\n \"about\": " + json.dumps(latest["about"], ensure_ascii=False) + ",\n \"records\": [\n")
        f.write(",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in recs))
        f.write("\n ]\n}\n")
    print(f"{a.latest}: {replaced} records replaced, {added} added")


if __name__ == "__main__":
    main()
