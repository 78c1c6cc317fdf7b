#!/usr/bin/env python3
"""What 8 images add to a chat request's TTFT beyond the vision encoder (issue 12's target: <= 5 %).

Starts `m3serve serve --device cpu` (or --device cuda) on a checkpoint with vision weights (the demo VL model of
`M3_DEMO_VISION=1 scripts/make_demo_model.sh`), prefix caching off, and sends, per repetition, with max_tokens 1
(latency ~= TTFT) and a fresh nonce:
  text      the text-only request
  images    the same text + N different JPEG data: URLs (new images every repetition: no media-cache hits)
  samelen   a text-only request padded to the same prompt length as `images` (the prefill the image slots cost)
The gateway and encoder wall times come from /metrics (request_media_{gateway,encode}_seconds), and the image
request's whole HTTP-side preparation from request_preprocess_seconds (the gateway is inside it; the encoder runs
when the engine asks for the features, inside the engine's TTFT); its path stage by stage from
request_stage_seconds{stage=...} (body receive, dispatch, parse, template, media collect / queue / load / hash /
process (+ its user and system CPU time) / expand, tokenise, submit) and the engine's part (arrival -> first token)
from time_to_first_token_seconds: each repetition's delta of the sums around the images request.
overhead = images - encode - samelen: what preprocessing, the request body (base64, JSON) and templating add.

Usage: media_ttft.py --m3serve BIN --model DIR --template JINJA --jpegs DIR [--images 8] [--reps 5] [--device cuda]
       [--serve-arg=--media-threads --serve-arg=8]
(`bench_media --write-jpegs DIR N HxW` writes the JPEGs.) Python 3 standard library only.
"""
import argparse
import base64
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time


def post(port, path, body):
    """POST `body` (a JSON value, or bytes already encoded); returns (seconds from send to the whole answer, answer)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = time.perf_counter()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise SystemExit(f"{path}: HTTP {r.status}: {out[:500]!r}")
    return dt, json.loads(out)


STAGES = ("body_receive", "dispatch", "parse", "template", "media_collect", "media_queue", "media_load", "media_hash",
          "media_process", "media_process_user", "media_process_sys", "media_expand", "tokenize", "submit")


def metric_sums(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for name in ("request_media_gateway_seconds", "request_media_encode_seconds", "request_preprocess_seconds",
                 "time_to_first_token_seconds"):
        for suffix in ("_sum", "_count"):
            m = re.search(r"^m3serve:" + name + suffix + r"(?:\{[^}]*\})?\s+(\S+)$", text, re.M)
            out[name + suffix] = float(m.group(1)) if m else 0.0
    # request_stage_seconds{...,stage="x"} (servers before it have none: the stages then read 0)
    for m in re.finditer(r'^m3serve:request_stage_seconds_sum\{[^}]*stage="([a-z_]+)"[^}]*\}\s+(\S+)$', text, re.M):
        out["stage:" + m.group(1)] = float(m.group(2))
    return out


def start_server(a):
    """`m3serve serve` on a free port with prefix caching off (a.m3serve, a.model, a.device, a.template,
    a.serve_arg); returns (process, port)."""
    proc = subprocess.Popen([a.m3serve, "serve", "--model", a.model, "--device", a.device, "--chat-template",
                             a.template, "--served-model-name", "m3", "--host", "127.0.0.1", "--port", "0",
                             "--max-model-len", "16384", "--no-enable-prefix-caching", "--max-body-bytes", "256MiB"]
                            + a.serve_arg,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.terminate()
    raise SystemExit("server did not start")


def jpeg_urls(a, need):
    """The first `need` JPEGs of a.jpegs (numbered img1.jpg, img2.jpg, …) as base64 data: URLs."""
    files = sorted((os.path.join(a.jpegs, f) for f in os.listdir(a.jpegs) if f.endswith(".jpg")),
                   key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0))
    if len(files) < need:
        raise SystemExit(f"need {need} JPEGs in {a.jpegs}, found {len(files)}")
    return ["data:image/jpeg;base64," + base64.b64encode(open(f, "rb").read()).decode() for f in files[:need]]


def delta(after, before, key):
    return after.get(key, 0.0) - before.get(key, 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--jpegs", required=True)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="serve --device (cpu, or cuda on the GPU host)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra `serve` argument, repeatable (e.g. --serve-arg=--media-threads --serve-arg=8)")
    a = ap.parse_args()
    urls = jpeg_urls(a, a.images * (a.reps + 1))

    proc, port = start_server(a)
    try:

        def chat(parts):
            return post(port, "/v1/chat/completions",
                        {"model": "m3", "max_tokens": 1, "temperature": 0,
                         "messages": [{"role": "user", "content": parts}]})

        text = "Describe what these pictures have in common, in one word. Request {}."
        res = {"text": [], "images": [], "samelen": []}
        gw, enc, pre, stages = [], [], [], []
        for r in range(a.reps + 1):  # repetition 0 warms up and is dropped
            nonce = f"{r}-{time.time_ns()}"
            t_text, j_text = chat([{"type": "text", "text": text.format(nonce)}])
            before = metric_sums(port)
            imgs = [{"type": "image_url", "image_url": {"url": u}} for u in urls[r * a.images:(r + 1) * a.images]]
            t_img, j_img = chat([{"type": "text", "text": text.format(nonce + "i")}] + imgs)
            after = metric_sums(port)
            # Text-only filler to the same prompt length (" x" is one token in Qwen3's BPE; checked below).
            pad = j_img["usage"]["prompt_tokens"] - j_text["usage"]["prompt_tokens"]
            t_same, j_same = chat([{"type": "text", "text": text.format(nonce + "s") + " x" * pad}])
            after_same = metric_sums(port)
            if r == 0:
                print(f"prompt tokens: text {j_text['usage']['prompt_tokens']}, images {j_img['usage']['prompt_tokens']}, "
                      f"same-length text {j_same['usage']['prompt_tokens']}", flush=True)
                continue
            res["text"].append(t_text)
            res["images"].append(t_img)
            res["samelen"].append(t_same)
            gw.append(after["request_media_gateway_seconds_sum"] - before["request_media_gateway_seconds_sum"])
            enc.append(after["request_media_encode_seconds_sum"] - before["request_media_encode_seconds_sum"])
            pre.append(after["request_preprocess_seconds_sum"] - before["request_preprocess_seconds_sum"])
            st = {k: delta(after, before, "stage:" + k) for k in STAGES}
            st["engine_ttft"] = delta(after, before, "time_to_first_token_seconds_sum")
            st["samelen_engine_ttft"] = delta(after_same, after, "time_to_first_token_seconds_sum")
            stages.append(st)
        med = {k: statistics.median(v) for k, v in res.items()}
        g, e = statistics.median(gw), statistics.median(enc)
        over = [i - en - s for i, en, s in zip(res["images"], enc, res["samelen"])]
        o = statistics.median(over)
        print(f"{a.images} images, {a.reps} repetitions, medians (ms):")
        print(f"  text-only TTFT {1e3 * med['text']:.1f}, same-length text TTFT {1e3 * med['samelen']:.1f}, "
              f"with images {1e3 * med['images']:.1f}")
        p = statistics.median(pre)
        rest = statistics.median([x - y for x, y in zip(pre, gw)])
        print(f"  media gateway {1e3 * g:.1f} (inside the images request), vision encoder {1e3 * e:.1f} (in the "
              f"engine's TTFT); the images request's whole preprocess {1e3 * p:.1f}, of which not gateway (JSON, "
              f"template, tokenise) {1e3 * rest:.1f}")
        print(f"  images - encoder - same-length text = {1e3 * o:.1f} ms = {100 * o / med['samelen']:.1f} % of the "
              f"same-length text TTFT; images - encoder - text-only = "
              f"{100 * (med['images'] - e - med['text']) / med['text']:.1f} % of the text-only TTFT")
        # The images request stage by stage (request_stage_seconds; media_queue/load/hash/process are sums over the
        # images, which run in parallel on the gateway's pool, so they are not part of the serial sum).
        sm = {k: statistics.median(x[k] for x in stages) for k in stages[0]}
        print("  images request by stage (medians, ms): " + ", ".join(f"{k} {1e3 * sm[k]:.1f}" for k in STAGES))
        serial = [x["body_receive"] + x["dispatch"] + p_ + x["submit"] + x["engine_ttft"]
                  for x, p_ in zip(stages, pre)]
        print(f"  serial path: body_receive + dispatch + preprocess + submit + engine (arrival -> first token "
              f"{1e3 * sm['engine_ttft']:.1f}; same-length text {1e3 * sm['samelen_engine_ttft']:.1f}) = "
              f"{1e3 * statistics.median(serial):.1f}; client TTFT - that (client send, response, strand hops) = "
              f"{1e3 * statistics.median([t - x for t, x in zip(res['images'], serial)]):.1f}")
        print("  before the engine (client TTFT - engine TTFT): images "
              f"{1e3 * statistics.median([t - x['engine_ttft'] for t, x in zip(res['images'], stages)]):.1f}, "
              "same-length text "
              f"{1e3 * statistics.median([t - x['samelen_engine_ttft'] for t, x in zip(res['samelen'], stages)]):.1f}")
        print("  per repetition (text, samelen, images, gateway, encode, preprocess) ms:")
        for k in range(a.reps):
            print("   ", ", ".join(f"{1e3 * x:.1f}" for x in
                                   (res["text"][k], res["samelen"][k], res["images"][k], gw[k], enc[k], pre[k])))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
