#!/usr/bin/env python3
"""Turns the end-to-end benchmark's e2e_runs.json (scripts/gpu_e2e_bench.sh) into a Markdown report
<results-dir>/<date>-e2e-<gpu>.md and updates <results-dir>/e2e_latest.json (one record per traffic x concurrency x
backend). Next to each measured decode step it puts the bytes-moved roofline: the bytes a decode step must read
(attention weights, the experts the batch actually routes to, dense MLPs, the lm_head, KV / index-K) over the copy
bandwidth (--bandwidth, default 4.2 TB/s measured on H200), and the ratio measured / roofline.

Usage: e2e_report.py E2E_RUNS_JSON --model-config CONFIG_JSON [--num-layers N] [--results-dir DIR]
                     [--bandwidth BYTES_PER_S]
Standard library only (runs on the device machine and here)."""
import argparse
import json
import os
import re
import sys


def load_text_config(path):
    c = json.load(open(path))
    return c.get("text_config", c)


def decode_step_bytes(tc, num_layers, batch, ctx, backend, wbytes=2, kvbytes=2):
    """Bytes one decode step of `batch` sequences at context `ctx` must read, by category."""
    H = tc["hidden_size"]
    hq, hkv, d = tc["num_attention_heads"], tc["num_key_value_heads"], tc.get("head_dim", H // tc["num_attention_heads"])
    sa = tc.get("sparse_attention_config", {})
    L = num_layers or tc["num_hidden_layers"]
    moe_freq = tc.get("moe_layer_freq", [0] * L)
    sparse_freq = sa.get("sparse_attention_freq", [0] * L)
    di, ih = sa.get("sparse_index_dim", 128), sa.get("sparse_num_index_heads", hkv)
    blk, topk = sa.get("sparse_block_size", 128), sa.get("sparse_topk_blocks", 16)
    E, k = tc.get("num_local_experts", 1), tc.get("num_experts_per_tok", 1)
    I, Is, Id = tc["intermediate_size"], tc.get("shared_intermediate_size", 0), tc["dense_intermediate_size"]
    V = tc["vocab_size"]
    # Distinct experts a batch routes to, for uniform routing (dummy weights): E (1 - (1 - k/E)^b).
    experts_used = E * (1.0 - (1.0 - k / E) ** batch) if E > 0 else 0.0
    b = {"attn_weights": 0.0, "expert_weights": 0.0, "mlp_weights": 0.0, "head_weights": 0.0, "kv_read": 0.0}
    for l in range(L):
        sparse = l < len(sparse_freq) and sparse_freq[l] == 1
        moe = l < len(moe_freq) and moe_freq[l] == 1
        b["attn_weights"] += ((hq * d + 2 * hkv * d) * H + H * hq * d) * wbytes
        if sparse:
            b["attn_weights"] += (ih * di + di) * H * wbytes  # index q / k projections
        if moe:
            b["expert_weights"] += experts_used * 3 * H * I * wbytes + 3 * H * Is * wbytes + E * H * 4
        else:
            b["mlp_weights"] += 3 * H * Id * wbytes
        kv_token = 2 * hkv * d * kvbytes  # K and V of one token, all KV heads
        if sparse and backend != "dense":
            # The indexer reads every index key; attention reads top-k blocks per KV head (≤ the context).
            b["kv_read"] += batch * (ctx * di * kvbytes + min(ctx, topk * blk) * kv_token)
        else:
            b["kv_read"] += batch * ctx * kv_token
    b["head_weights"] = V * H * wbytes + batch * H * wbytes
    b["experts_used_per_moe_layer"] = experts_used
    b["total"] = sum(v for key, v in b.items() if key != "experts_used_per_moe_layer")
    return b


PROFILE_RE = re.compile(r"(decode|prefill) (\d+) steps, ([0-9.]+) ms/step:(.*)")
CAT_RE = re.compile(r"([a-z+]+) ([0-9.]+) ms \((\d+)%\)")


def parse_profile(s):
    """"decode 812 steps, 3.100 ms/step: attention 1.0 ms (32%) … | prefill …" → {kind: {steps, ms, cats}}."""
    res = {}
    for part in (s or "").split("|"):
        m = PROFILE_RE.search(part.strip())
        if not m:
            continue
        res[m.group(1)] = {"steps": int(m.group(2)), "ms_per_step": float(m.group(3)),
                           "cats": {c: float(ms) for c, ms, _ in CAT_RE.findall(m.group(4))}}
    return res


IDLE_RE = re.compile(r"gpu idle between back-to-back decode steps ([0-9.]+)% \(([0-9.]+) of ([0-9.]+) ms\)")


def parse_idle(s):
    """The profile's "gpu idle between back-to-back decode steps 3.1% (12 of 400 ms)" → 3.1, or None."""
    m = IDLE_RE.search(s or "")
    return float(m.group(1)) if m else None


def fmt(v, nd=1):
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs_json")
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--num-layers", type=int, default=0)
    ap.add_argument("--results-dir", default="bench/results")
    ap.add_argument("--bandwidth", type=float, default=4.2e12)
    a = ap.parse_args()
    doc = json.load(open(a.runs_json))
    tc = load_text_config(a.model_config)
    L = a.num_layers or doc.get("num_layers") or tc["num_hidden_layers"]
    L = min(L, tc["num_hidden_layers"])
    wbytes = 2 if doc.get("dtype", "bfloat16") in ("bfloat16", "bf16", "auto") else 4
    date, gpu, commit = doc["date"], doc["gpu"], doc["commit"]

    rows, records = [], []
    for r in doc["runs"]:
        b = r.get("bench") or {}
        prof = parse_profile(r.get("gpu_profile", ""))
        conc = r.get("concurrency", 1)
        ok = (b.get("requests") or {}).get("ok", 0)
        cfg = b.get("config") or {}
        out_len = cfg.get("output_len", 0)
        ctx = (b.get("input_tokens", 0) / ok + out_len / 2) if ok else 0
        roof = decode_step_bytes(tc, L, conc if r["traffic"] == "agentic" else 1, ctx, r["backend"], wbytes, wbytes)
        roof_ms = roof["total"] / a.bandwidth * 1e3 if ok else None
        tpot = (b.get("tpot_ms") or {})
        ttft = (b.get("ttft_ms") or {})
        itl = (b.get("itl_ms") or {})
        srv = b.get("server") or {}
        dec = prof.get("decode")
        row = dict(r=r, b=b, prof=prof, ctx=ctx, roof=roof, roof_ms=roof_ms, tpot=tpot, ttft=ttft, itl=itl, srv=srv,
                   ratio=(tpot.get("p50") / roof_ms) if tpot.get("n") and roof_ms else None,
                   gpu_ratio=(dec["ms_per_step"] / roof_ms) if dec and roof_ms else None)
        rows.append(row)
        if b and ok:
            records.append({
                "traffic": r["traffic"], "concurrency": conc, "backend": r["backend"],
                "output_tok_s": round(b.get("output_tok_s", 0.0), 3),
                "ttft_ms_p50": round(ttft.get("p50", 0.0), 3), "ttft_ms_p99": round(ttft.get("p99", 0.0), 3),
                "tpot_ms_p50": round(tpot.get("p50", 0.0), 3), "tpot_ms_p99": round(tpot.get("p99", 0.0), 3),
                "prefix_hit_rate": round(b.get("prefix_hit_rate", 0.0), 4),
                "context_tokens": round(ctx), "roofline_ms_per_step": round(roof_ms, 4),
                "tpot_over_roofline": round(row["ratio"], 3) if row["ratio"] else None,
                "decode_gpu_ms_per_step": dec["ms_per_step"] if dec else None,
                "preprocess_ms_mean": round(srv.get("preprocess_s_mean", 0.0) * 1e3, 3) if srv else None,
                "commit": commit, "gpu": gpu, "date": date, "device": doc.get("device", "cuda"),
                "model": f'{doc.get("model", "?")} ({L} layers, {doc.get("dtype", "?")})'})

    gslug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    gslug = "h200" if "h200" in gslug else (gslug.split("-")[0] if gslug else "gpu")
    os.makedirs(a.results_dir, exist_ok=True)
    md_path = os.path.join(a.results_dir, f"{date}-e2e-{gslug}.md")
    lines = [f"# End-to-end benchmark: `m3serve serve` + `m3serve bench-serve` on a full-width M3 slice ({gpu})", "",
             f"- Date: {doc.get('time', date)}. GPU: {gpu}. Commit: {commit}. Device: {doc.get('device')}.",
             f"- Command (device): `{doc.get('command')}`",
             (f"- Model: {doc.get('model')} config, first {L} layers (`--num-layers {L}`), `--dtype {doc.get('dtype')}`, "
              f"dummy weights (`--load-format dummy`); plan `{doc.get('plan')}`." if doc.get("device", "cuda") != "cpu" else
              f"- Model: {doc.get('model')} ({L} layers, checkpoint weights, CPU fp32) — a dry run of the path; "
              f"plan `{doc.get('plan')}`."),
             f"- Roofline: bytes a decode step must read / {a.bandwidth / 1e12:.1f} TB/s (attention + index weights, "
             "the experts the batch routes to — E(1-(1-k/E)^b) for uniform routing —, shared expert, dense MLPs, "
             "lm_head, and per sequence the KV of dense layers, every index key plus the top-k blocks of MSA layers). "
             "Ratio = measured TPOT p50 / roofline (≥ 1; 1.0 = at the bandwidth floor).", ""]
    for n in doc.get("notes") or []:
        lines.append(f"- Note: {n}")
    lines += ["", "| backend | traffic | conc | status | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms "
              "| prefix hit | ctx | KV GiB used / pool | preproc ms (% of TTFT p50) | detok ms | GPU decode ms/step | roofline ms "
              "| TPOT / roof |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in rows:
        r, b, srv = w["r"], w["b"], w["srv"]
        dec = w["prof"].get("decode")
        kv = "—"
        if srv:
            kv = f'{srv.get("kv_cache_used_bytes_peak", 0) / 2**30:.2f} / {srv.get("kv_cache_bytes", 0) / 2**30:.1f}'
        lines.append("| " + " | ".join([
            r["backend"], r["traffic"], str(r.get("concurrency")), r.get("status", "?"),
            fmt(b.get("output_tok_s")),
            f'{fmt(w["ttft"].get("p50"))} / {fmt(w["ttft"].get("p99"))}' if w["ttft"] else "—",
            f'{fmt(w["tpot"].get("p50"), 2)} / {fmt(w["tpot"].get("p99"), 2)}' if w["tpot"] else "—",
            f'{fmt(w["itl"].get("p50"), 2)} / {fmt(w["itl"].get("p99"), 2)}' if w["itl"] else "—",
            f'{100 * b.get("prefix_hit_rate", 0):.1f} %' if b else "—",
            f'{w["ctx"]:.0f}', kv,
            (fmt(srv.get("preprocess_s_mean", 0) * 1e3, 2) + (
                f' ({100 * srv.get("preprocess_s_mean", 0) * 1e3 / w["ttft"]["p50"]:.1f} %)'
                if w["ttft"].get("p50") else "")) if srv else "—",
            fmt(srv.get("detokenize_s_mean", 0) * 1e3, 2) if srv else "—",
            fmt(dec["ms_per_step"], 2) if dec else "—",
            fmt(w["roof_ms"], 3), fmt(w["ratio"], 2) + (f' ({fmt(w["gpu_ratio"], 2)} GPU)' if w["gpu_ratio"] else "")])
            + " |")

    # Where the GPU time goes (M3_STEP_PROFILE=1).
    prof_rows = [w for w in rows if w["prof"]]
    if prof_rows:
        cats = []
        for w in prof_rows:
            for kind in w["prof"].values():
                for c in kind["cats"]:
                    if c not in cats:
                        cats.append(c)
        lines += ["", "GPU time per step by category (CUDA events, `src/model/gpu_step_profile.*`), ms/step:", "",
                  "| backend | traffic | conc | step | steps | total | " + " | ".join(cats) + " |",
                  "|---|---|---|---|---|---|" + "---|" * len(cats)]
        for w in prof_rows:
            for kind in ("decode", "prefill"):
                p = w["prof"].get(kind)
                if not p:
                    continue
                lines.append(f'| {w["r"]["backend"]} | {w["r"]["traffic"]} | {w["r"]["concurrency"]} | {kind} | '
                             f'{p["steps"]} | {p["ms_per_step"]:.3f} | '
                             + " | ".join(fmt(p["cats"].get(c), 3) for c in cats) + " |")

    idle = [(w, parse_idle(w["r"].get("gpu_profile", ""))) for w in rows]
    idle = [(w, v) for w, v in idle if v is not None]
    if idle:
        lines += ["", "GPU idle between back-to-back decode steps (host wall time from one decode step's start to the "
                  "next, against the first step's GPU time; `src/model/gpu_step_profile.*`):", ""]
        lines += [f'- {w["r"]["backend"]} {w["r"]["traffic"]} c{w["r"]["concurrency"]}: {v:.1f} %' for w, v in idle]

    # Roofline breakdown.
    lines += ["", "Bytes a decode step must read (MB): attention+index weights / experts / dense MLPs / lm_head / KV:", ""]
    for w in rows:
        ro = w["roof"]
        if w["roof_ms"] is None:
            continue
        lines.append(f'- {w["r"]["backend"]} {w["r"]["traffic"]} c{w["r"]["concurrency"]}, ctx {w["ctx"]:.0f}: '
                     f'{ro["attn_weights"] / 1e6:.0f} / {ro["expert_weights"] / 1e6:.0f} '
                     f'({ro["experts_used_per_moe_layer"]:.1f} experts per MoE layer) / {ro["mlp_weights"] / 1e6:.0f} / '
                     f'{ro["head_weights"] / 1e6:.0f} / {ro["kv_read"] / 1e6:.0f} = {ro["total"] / 1e6:.0f} MB '
                     f'→ {w["roof_ms"]:.3f} ms')

    # The MSA speed-up, measured in one run: same traffic and concurrency, other backends.
    by = {(w["r"]["traffic"], w["r"]["concurrency"], w["r"]["backend"]): w for w in rows if w["tpot"].get("n")}
    sp = []
    for (tr, c, be), w in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if be == "msa":
            continue
        m = by.get((tr, c, "msa"))
        if m and m["tpot"].get("p50"):
            sp.append(f'- {tr} c{c}: TPOT p50 {be} {w["tpot"]["p50"]:.2f} ms vs msa {m["tpot"]["p50"]:.2f} ms → '
                      f'msa is {w["tpot"]["p50"] / m["tpot"]["p50"]:.2f}x faster per token; output tok/s '
                      f'{w["b"].get("output_tok_s", 0):.1f} vs {m["b"].get("output_tok_s", 0):.1f}')
    if sp:
        lines += ["", "MSA vs the other attention backends (same traffic, same run):", ""] + sp
    lines += ["", "Raw: e2e_runs.json of the run (bench-serve JSON per run, server /metrics, server logs)."]
    open(md_path, "w").write("\n".join(lines) + "\n")

    latest_path = os.path.join(a.results_dir, "e2e_latest.json")
    latest = {"records": []}
    if os.path.exists(latest_path):
        try:
            latest = json.load(open(latest_path))
        except ValueError:
            print(f"warning: {latest_path} is not JSON; rewriting it", file=sys.stderr)
    # A long run's record is kept per context length (a 60k and a 1M prompt are different measurements).
    def rec_key(x):
        ctx = x.get("context_tokens") or 0
        return (x.get("traffic"), x.get("concurrency"), x.get("backend"),
                round(ctx / 1000) if x.get("traffic") == "long" else None)
    keep = {rec_key(x) for x in records}
    merged = [x for x in latest.get("records", []) if rec_key(x) not in keep]
    merged += records
    merged.sort(key=lambda x: (x.get("traffic", ""), x.get("backend", ""), x.get("concurrency", 0),
                               x.get("context_tokens", 0)))
    latest = {"description": "Latest end-to-end records (scripts/gpu_e2e_bench.sh → scripts/e2e_report.py), one per "
                             "traffic x concurrency x backend (long runs also per context length); docs/BENCHMARKS.md explains the fields.",
              "updated": date, "records": merged}
    json.dump(latest, open(latest_path, "w"), indent=2)
    print(f"wrote {md_path} ({len(rows)} runs) and {latest_path} ({len(records)} records updated)")
    for line in lines:
        if line.startswith("| ") or line.startswith("- "):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
