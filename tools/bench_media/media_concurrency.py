#!/usr/bin/env python3
"""Does the engine wait for media preprocessing? (issue 12; the seed's fourth technique: image work on CPU threads so
the engine never waits for it.)

Starts `m3serve serve` like media_ttft.py and runs K streaming text generations (min_tokens = max_tokens = --tokens,
a cap: the streams are closed when their phase ends) in two phases of the same length:
  images   while they stream, R chat requests with N fresh JPEG data: URLs each (max_tokens 1), one after another;
  idle     nothing else, for as long as the images phase took.
Every content chunk's arrival is stamped (time.perf_counter, CLOCK_MONOTONIC, so stamps compare across processes) by
one reader process per stream, and the image requests are sent from the main process as bytes encoded before the
phase: nothing the sender does (a 16 MB json.dumps holds the GIL for 20-160 ms) can delay or bunch the stamps.
An inter-token latency (ITL) is the gap between two chunks of one stream; the images phase's gaps are split by what
they overlap on the server (a gap overlapping several windows counts in the first class that applies):
  preprocess  an image request between its send and the moment its media was ready (the gateway's wall time, from
              /metrics: request_media_gateway_seconds, placed at the request's send + its body receive / dispatch /
              parse / template stages) — the body, the JSON and the decode / resize / patchify the engine must not
              wait for;
  encode      the same request from media ready to its answer (vision encoder, prefill: engine work);
  between     no image request in flight.
Per image request it prints the chunks that arrived inside its preprocess window against what the idle rate gives
and the longest gap overlapping the window: a stall cannot hide in the percentiles. If the engine keeps stepping while
images are decoded, the preprocess ITLs match the idle ones; the encoder and the prefill show up in `encode`.

Usage: media_concurrency.py --m3serve BIN --model DIR --template JINJA --jpegs DIR [--streams 4] [--tokens 4096]
       [--images 8] [--requests 3] [--device cuda] [--serve-arg=--media-threads --serve-arg=8]
Python 3 standard library only.
"""
import argparse
import http.client
import json
import multiprocessing
import statistics
import sys
import time

from media_ttft import jpeg_urls, metric_sums, post, start_server


def stream_worker(i, port, prompt, tokens, stop, q):
    """Reader process of one streaming chat generation: ("started", i) at its first content chunk, then
    ("stamps", i, arrival times, ended by itself) once `stop` is set (the connection is closed: the server aborts the
    generation) or the stream ends; ("error", i, text) on failure."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        body = {"model": "m3", "max_tokens": tokens, "min_tokens": tokens, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": prompt}]}
        c.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        stamps, ended = [], True
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                chunk = json.loads(line[6:])
                delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
                if delta.get("content"):
                    stamps.append(time.perf_counter())
                    if len(stamps) == 1:
                        q.put(("started", i))
            if stop.is_set():
                ended = False
                break
        c.close()
        if not stamps:
            raise RuntimeError("the stream ended without content")
        q.put(("stamps", i, stamps, ended))
    except Exception as e:  # reported to the main process, which stops the run
        q.put(("error", i, repr(e)))


def run_phase(port, k, tokens, tag, during=None, seconds=0.0):
    """K streams in reader processes; once each has its first token, `during()` runs (or `seconds` pass), then the
    streams are stopped. Returns (phase start, phase end, [(stamps, ended by itself)] per stream)."""
    ctx = multiprocessing.get_context()
    stop, q = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=stream_worker, args=(i, port, f"Stream {tag}-{i}: count slowly.", tokens, stop, q),
                         daemon=True) for i in range(k)]
    for p in procs:
        p.start()
    out, started = [None] * k, 0

    def take():
        msg = q.get(timeout=900)
        if msg[0] == "error":
            stop.set()
            raise SystemExit(f"stream {msg[1]}: {msg[2]}")
        if msg[0] == "started":
            return 1
        out[msg[1]] = (msg[2], msg[3])
        return 0

    try:
        while started < k:
            started += take()
        t_start = time.perf_counter()
        if during:
            during()
        else:
            time.sleep(seconds)
        t_end = time.perf_counter()
        stop.set()
        while any(o is None for o in out):
            take()
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=60)
    return t_start, t_end, out


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def summary(name, itl):
    return (f"  {name:<11} {len(itl):>5} gaps: p50 {1e3 * pct(itl, 0.5):7.2f}  p90 {1e3 * pct(itl, 0.9):7.2f}  "
            f"p99 {1e3 * pct(itl, 0.99):7.2f}  max {1e3 * max(itl, default=float('nan')):7.2f} ms")


def phase_gaps(t_start, t_end, streams, name):
    """Gaps (a, b) of each stream that end inside the phase; warns about streams that ended before the phase."""
    gaps = []
    for i, (s, ended) in enumerate(streams):
        if ended and s[-1] < t_end:
            print(f"  warning: {name} stream {i} ended {1e3 * (t_end - s[-1]):.0f} ms before its phase did "
                  "(raise --tokens)")
        gaps += [(s[j - 1], s[j]) for j in range(1, len(s)) if t_start <= s[j] <= t_end]
    return gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--jpegs", required=True)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096,
                    help="each stream's length cap; it must outlast the images phase (a warning says when not)")
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--serve-arg", action="append", default=[])
    a = ap.parse_args()
    urls = jpeg_urls(a, a.images * (a.requests + 1))
    # Every image request's body, encoded now: sending one is then only the socket write.
    bodies = []
    for r in range(a.requests + 1):
        parts = [{"type": "text", "text": f"What do these show? Request {r}-{time.time_ns()}."}]
        parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls[r * a.images:(r + 1) * a.images]]
        bodies.append(json.dumps({"model": "m3", "max_tokens": 1, "temperature": 0,
                                  "messages": [{"role": "user", "content": parts}]}).encode())
    del urls
    proc, port = start_server(a)
    try:
        post(port, "/v1/chat/completions", bodies[0])  # warm-up: the encoder, the gateway's threads
        run_phase(port, a.streams, 8, "warm")

        windows = []  # (send, media ready, answered, gateway s, encoder s) per image request

        def images():
            for r in range(1, a.requests + 1):
                before = metric_sums(port)
                t0 = time.perf_counter()
                post(port, "/v1/chat/completions", bodies[r])
                t1 = time.perf_counter()
                after = metric_sums(port)
                d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                head = sum(d.get("stage:" + s, 0.0) for s in ("body_receive", "dispatch", "parse", "template"))
                gw = d["request_media_gateway_seconds_sum"]
                windows.append((t0, t0 + head + gw, t1, gw, d["request_media_encode_seconds_sum"]))

        b_start, b_end, busy = run_phase(port, a.streams, a.tokens, "images", images)
        i_start, i_end, idle = run_phase(port, a.streams, a.tokens, "idle", seconds=b_end - b_start)

        print(f"{a.streams} streams; images phase {1e3 * (b_end - b_start):.0f} ms: {a.requests} requests × "
              f"{a.images} JPEGs ({len(bodies[1]) / 1e6:.1f} MB bodies); idle phase {1e3 * (i_end - i_start):.0f} ms")
        idle_itl = [b - a_ for a_, b in phase_gaps(i_start, i_end, idle, "idle")]
        busy_gaps = phase_gaps(b_start, b_end, busy, "images")
        idle_p50 = statistics.median(idle_itl) if idle_itl else float("nan")
        classes = {"preprocess": [], "encode": [], "between": []}
        for a_, b in busy_gaps:
            if any(a_ < ready and b > t0 for t0, ready, *_ in windows):
                classes["preprocess"].append(b - a_)
            elif any(a_ < t1 and b > ready for _, ready, t1, *_ in windows):
                classes["encode"].append(b - a_)
            else:
                classes["between"].append(b - a_)
        for t0, ready, t1, gw, enc in windows:
            inside = sum(1 for s, _ in busy for t in s if t0 <= t <= ready)
            over = [b - a_ for a_, b in busy_gaps if a_ < ready and b > t0]
            print(f"  image request: media ready after {1e3 * (ready - t0):.1f} ms (gateway {1e3 * gw:.1f}), "
                  f"answered after {1e3 * (t1 - t0):.1f} ms, vision encoder {1e3 * enc:.1f} ms")
            print(f"    preprocess window: {inside} chunks arrived (the idle rate gives "
                  f"{a.streams * (ready - t0) / idle_p50:.0f}), {len(over)} gaps overlap it, the longest "
                  f"{1e3 * max(over, default=float('nan')):.2f} ms")
            enc_gaps = [(b - a_, b) for a_, b in busy_gaps if a_ < t1 and b > ready]
            if enc_gaps:
                g, end = max(enc_gaps)
                print(f"    media ready -> answer: {len(enc_gaps)} gaps, the longest {1e3 * g:.2f} ms "
                      f"(ending {1e3 * (end - t0):.1f} ms after the send)")
        print("inter-token latency of the text streams:")
        print(summary("idle", idle_itl))
        for name, itl in classes.items():
            print(summary(name, itl))
        if classes["preprocess"] and idle_itl:
            print(f"preprocess p50 / idle p50 = {statistics.median(classes['preprocess']) / idle_p50:.3f}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
