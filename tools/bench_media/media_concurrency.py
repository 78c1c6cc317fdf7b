#!/usr/bin/env python3
"""Does the GPU wait for media preprocessing? (issue 12; the seed's fourth technique: image work on CPU threads so
the engine never waits for it.)

Starts `m3serve serve` like media_ttft.py and runs K streaming text generations (min_tokens = max_tokens, so every
stream runs to its length) twice:
  idle     nothing else;
  images   while they stream, R chat requests with N fresh JPEG data: URLs each (max_tokens 1), one after another.
Every content chunk's arrival is stamped on the client; an inter-token latency (ITL) is the gap between two chunks of
one stream. The images phase's ITLs are split by what was happening on the server at the gap's end:
  preprocess  an image request was between its send and the moment its media was ready (the gateway's wall time, from
              /metrics: request_media_gateway_seconds, placed at the request's send + its body receive / dispatch /
              parse stages) — the decode / resize / patchify the engine must not wait for;
  rest        any other time of the phase (its encoder step and prefill are engine work and show up here).
If the engine keeps stepping while images are decoded, the preprocess ITLs match the idle ones; the encoder's GPU
time shows up once per image request as one long gap in the rest.

Usage: media_concurrency.py --m3serve BIN --model DIR --template JINJA --jpegs DIR [--streams 4] [--tokens 256]
       [--images 8] [--requests 3] [--device cuda] [--serve-arg=--media-threads --serve-arg=8]
Python 3 standard library only.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time

from media_ttft import jpeg_urls, metric_sums, post, start_server


def stream(port, prompt, tokens, stamps):
    """One streaming chat generation; appends each content chunk's arrival time (perf_counter) to stamps."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "m3", "max_tokens": tokens, "min_tokens": tokens, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}
    c.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"stream: HTTP {r.status}: {r.read()[:300]!r}")
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
            if delta.get("content"):
                stamps.append(time.perf_counter())


def run_streams(port, k, tokens, tag, during=None):
    """K streams at once; `during(started)` runs beside them once every stream has its first token."""
    stamps = [[] for _ in range(k)]
    threads = [threading.Thread(target=stream, args=(port, f"Stream {tag}-{i}: count slowly.", tokens, stamps[i]))
               for i in range(k)]
    for t in threads:
        t.start()
    if during:
        while any(len(s) < 2 for s in stamps):
            time.sleep(0.005)
        during()
    for t in threads:
        t.join()
    return stamps


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def summary(name, itl):
    return (f"  {name:<11} {len(itl):>5} gaps: p50 {1e3 * pct(itl, 0.5):7.2f}  p90 {1e3 * pct(itl, 0.9):7.2f}  "
            f"p99 {1e3 * pct(itl, 0.99):7.2f}  max {1e3 * max(itl, default=float('nan')):7.2f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--jpegs", required=True)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--serve-arg", action="append", default=[])
    a = ap.parse_args()
    urls = jpeg_urls(a, a.images * (a.requests + 1))
    proc, port = start_server(a)
    try:
        def image_request(r):
            parts = [{"type": "text", "text": f"What do these show? Request {r}-{time.time_ns()}."}]
            parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls[r * a.images:(r + 1) * a.images]]
            return post(port, "/v1/chat/completions",
                        {"model": "m3", "max_tokens": 1, "temperature": 0,
                         "messages": [{"role": "user", "content": parts}]})

        image_request(0)  # warm-up: the encoder, the gateway's threads
        run_streams(port, a.streams, 8, "warm")
        idle = run_streams(port, a.streams, a.tokens, "idle")

        windows = []  # (send, media ready, done) per image request

        def images():
            for r in range(1, a.requests + 1):
                before = metric_sums(port)
                t0 = time.perf_counter()
                image_request(r)
                t1 = time.perf_counter()
                after = metric_sums(port)
                d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                head = sum(d.get("stage:" + s, 0.0) for s in ("body_receive", "dispatch", "parse", "template"))
                ready = t0 + head + d["request_media_gateway_seconds_sum"]
                windows.append((t0, ready, t1, d["request_media_gateway_seconds_sum"],
                                d["request_media_encode_seconds_sum"]))

        busy = run_streams(port, a.streams, a.tokens, "images", images)

        def gaps(stamps):
            return [(s[i - 1], s[i]) for s in stamps for i in range(1, len(s))]

        idle_itl = [b - a_ for a_, b in gaps(idle)]
        pre, rest = [], []
        for a_, b in gaps(busy):
            (pre if any(t0 <= b <= ready for t0, ready, *_ in windows) else rest).append(b - a_)
        print(f"{a.streams} streams × {a.tokens} tokens; images phase: {a.requests} requests × {a.images} JPEGs")
        for t0, ready, t1, gw, enc in windows:
            print(f"  image request: media ready after {1e3 * (ready - t0):.1f} ms (gateway {1e3 * gw:.1f}), "
                  f"answered after {1e3 * (t1 - t0):.1f} ms, vision encoder {1e3 * enc:.1f} ms")
        print("inter-token latency of the text streams:")
        print(summary("idle", idle_itl))
        print(summary("preprocess", pre))
        print(summary("rest", rest))
        if pre and idle_itl:
            print(f"preprocess p50 / idle p50 = {statistics.median(pre) / statistics.median(idle_itl):.3f}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
