#!/usr/bin/env python3
"""The end-to-end benchmark path on the CPU (docs/BENCHMARKS.md): scripts/gpu_e2e_bench.sh with M3_E2E_DEVICE=cpu
and small counts starts `m3serve serve` on the demo model per run, drives it with `m3serve bench-serve --traffic
agentic` (text prompts sized through /tokenize, then token-id prompts) and `--traffic long`, and
scripts/e2e_report.py writes the Markdown report and e2e_latest.json. Checks that every request succeeded with
exactly the asked output tokens, that the agentic turns hit the prefix cache, that the server's preprocess /
detokenize / KV-bytes metrics arrived, and that the report merges records instead of duplicating them.
Usage: bench_dry_run_test.py M3SERVE_BINARY DEMO_MODEL_DIR REPO_ROOT"""
import json
import os
import subprocess
import sys
import tempfile


def run_script(root, m3serve, model, out, plan, prompt_format, **extra):
    env = dict(os.environ, M3_E2E_DEVICE="cpu", M3_E2E_M3SERVE=m3serve, M3_E2E_MODEL=model, M3_E2E_PLAN=plan,
               M3_E2E_BUDGET="900", M3_E2E_MIN_RUN="5", M3_E2E_LONG_MIN="5", M3_E2E_PREFIX="300", M3_E2E_SUFFIX_MIN="20",
               M3_E2E_SUFFIX_MAX="40", M3_E2E_OUTPUT="6", M3_E2E_TURNS="2", M3_E2E_LONG="700",
               M3_E2E_LONG_OUTPUT="4", M3_E2E_PROMPT_FORMAT=prompt_format, M3_E2E_KV_MEMORY="", M3_COMMIT="test",
               PYTHON=sys.executable)
    env.update(extra)
    p = subprocess.run(["bash", os.path.join(root, "scripts/gpu_e2e_bench.sh"), out], env=env, capture_output=True,
                       text=True, timeout=500)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.load(open(os.path.join(out, "e2e_runs.json"))), p.stdout


def check_runs(doc, expect, log):
    runs = {(r["backend"], r["traffic"], r["concurrency"]): r for r in doc["runs"]}
    assert set(runs) == set(expect), (sorted(runs), log)
    for key, r in runs.items():
        b = r["bench"]
        assert r["status"] == "ok" and b, (key, r.get("status"), log)
        req = b["requests"]
        assert req["ok"] == req["total"] and req["failed"] == 0, (key, req, b.get("first_error"))
        if r["traffic"] == "agentic":
            conc = key[2]
            assert req["total"] == 2 * conc, (key, req)  # sessions = concurrency, 2 turns each
            assert b["output_tokens"] == 6 * req["total"], (key, b["output_tokens"])
            # Every turn starts with the warmed 300-token prefix; turn 2 also re-sends turn 1's prompt.
            assert b["prefix_hit_rate"] > 0.5, (key, b["prefix_hit_rate"])
            assert b["input_tokens"] >= req["total"] * (300 + 20), (key, b["input_tokens"])
        else:
            assert req["total"] == 1 and b["output_tokens"] == 4, (key, b)
            assert b["input_tokens"] >= 600, b["input_tokens"]  # about 700, counted by the server's tokenizer
        assert b["ttft_ms"]["n"] == req["ok"] and b["tpot_ms"]["p50"] > 0, (key, b["ttft_ms"], b["tpot_ms"])
        s = b["server"]
        assert s and s["kv_cache_bytes"] > 0 and s["kv_page_bytes"] > 0, (key, s)
        assert s["preprocess_count"] == req["total"] and s["preprocess_s_mean"] > 0, (key, s)
        assert s["detokenize_count"] == req["total"], (key, s)
        assert b["tags"]["backend"] == key[0]


def main():
    m3serve, model, root = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "text")
        # One server per plan entry (M3_E2E_RESTART=0) keeps the test short; the ids run below restarts per run.
        doc, log = run_script(root, m3serve, model, out, "msa:2,1 dense:1 msa:long", "text", M3_E2E_RESTART="0")
        check_runs(doc, {("msa", "agentic", 2), ("msa", "agentic", 1), ("dense", "agentic", 1), ("msa", "long", 1)},
                   log)
        mds = [f for f in os.listdir(out) if f.endswith(".md") and "-e2e-" in f]
        assert len(mds) == 1, os.listdir(out)
        md = open(os.path.join(out, mds[0])).read()
        assert "| msa | agentic | 2 | ok |" in md and "roofline" in md and "MSA vs" in md, md
        latest = json.load(open(os.path.join(out, "e2e_latest.json")))
        assert len(latest["records"]) == 4, latest
        for rec in latest["records"]:
            for k in ("output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "prefix_hit_rate",
                      "commit", "gpu", "date"):
                assert k in rec, (k, rec)
        # Re-running the report updates records in place.
        subprocess.run([sys.executable, os.path.join(root, "scripts/e2e_report.py"), os.path.join(out, "e2e_runs.json"),
                        "--model-config", os.path.join(model, "config.json"), "--results-dir", out],
                       check=True, capture_output=True)
        assert len(json.load(open(os.path.join(out, "e2e_latest.json")))["records"]) == 4

        # Token-id prompts.
        out2 = os.path.join(tmp, "ids")
        doc2, log2 = run_script(root, m3serve, model, out2, "msa:1", "ids")
        check_runs(doc2, {("msa", "agentic", 1)}, log2)

        # Out of budget: every entry is skipped with a note, and the report still comes out.
        out3 = os.path.join(tmp, "skip")
        doc3, log3 = run_script(root, m3serve, model, out3, "msa:1 dense:1", "ids", M3_E2E_MIN_RUN="100000")
        assert doc3["runs"] == [] and len([n for n in doc3["notes"] if n.startswith("skipped")]) == 2, (doc3, log3)
        assert os.path.exists(os.path.join(out3, "e2e_latest.json")), log3
    print("bench dry run: ok")


if __name__ == "__main__":
    main()
