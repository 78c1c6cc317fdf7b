#!/usr/bin/env bash
# One device call for issue 12's GPU-host measurements (never run yet — written 2026-12-02d, when the device was
# out): the media gateway built on the GPU machine from the carried image codecs (scripts/gpu_deps.sh; no FFmpeg, so
# videos get an error there), its CPU tests, bench_media's per-core throughput on the same host as HF's processor
# (the same-machine ratio the issue asks for), and the 8-image TTFT through `serve --device cuda` on the demo VL model
# (vision tower on CUDA, --media-threads 8), and the text streams' inter-token latency while such requests are
# preprocessed (media_concurrency.py).
#   device `run`: carry [".gpudeps", ".gpucarry"], command `bash scripts/gpu_media_run.sh $OUT`   (≈ 5–7 minutes)
#   M3_MEDIA_CONC_ONLY=1: build, the demo VL model and media_concurrency.py only (no tests, throughput or TTFT).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu_media}}"
mkdir -p "$out"
cd "$root"
. scripts/gpu_env.sh >/dev/null 2>&1
t0=$(date +%s)
rm -rf build-gpu/src/media  # a warm machine's objects may predate gpu_env.sh's CPATH (the JPEG header fix)
M3_TARGETS="m3serve bench_media media_test" M3_SKIP_TESTS=1 M3_SKIP_BENCH=1 M3_SKIP_E2E=1 \
  timeout 300 bash scripts/gpu_run.sh "$out/build" >/dev/null 2>&1
tail -1 "$out/build/summary.md"
grep -E "m3_media" "$out/build/build.log" | head -3
find_bin() { find build-gpu -name "$1" -type f | head -1; }
M=$(find_bin media_test)
B=$(find_bin bench_media)
S=build-gpu/bin/m3serve
conc_only="${M3_MEDIA_CONC_ONLY:-0}"
if [ -n "$M" ] && [ "$conc_only" != 1 ]; then
  timeout 120 "$M" >"$out/media_test.txt" 2>&1; echo "== media_test: rc $?"; tail -1 "$out/media_test.txt"
fi
# Same-host throughput: ours per core (median call) and HF's processor (torch threads = 1) on the same pixels.
if [ -n "$B" ] && [ "$conc_only" != 1 ]; then
  timeout 90 "$B" 2 >"$out/bench_media.txt" 2>&1; echo "== bench_media: rc $?"
  grep -iE "img/s|1080p|4k" "$out/bench_media.txt" | head -12
  timeout 60 "$B" 2 jpeg-kept >"$out/bench_media_kept.txt" 2>&1; echo "== bench_media jpeg-kept: rc $?"
  grep -iE "img/s|1080p|4k" "$out/bench_media_kept.txt" | head -6
fi
if [ "$conc_only" != 1 ]; then
  timeout 240 python3 scripts/oracle/make_media_fixtures.py --out "$out/hf_fixtures" >"$out/hf_fixtures.log" 2>&1
  echo "== HF processor (make_media_fixtures.py bench): rc $?"
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['bench'], indent=1))" \
    "$out/hf_fixtures/media_fixtures.json" 2>&1 | head -20
  rm -f "$out"/hf_fixtures/media_rows.f32 "$out"/hf_fixtures/*.tar
fi
# 8 images × 1080p through the GPU server: the demo VL model with the carried o200k tokenizer.
vl=/tmp/m3-demo-vl
tok=/tmp/m3-o200k && mkdir -p "$tok"  # gpu_carry.sh ships the tokenizer gzipped (64 MiB carry limit)
gzip -dc "$root/.gpucarry/tokenizer-o200k/tokenizer.json.gz" >"$tok/tokenizer.json"
cp "$root/.gpucarry/tokenizer-o200k/tokenizer_config.json" "$tok/"
M3_DEMO_VISION=1 M3_DEMO_TOKENIZER_DIR="$tok" PYTHON=python3 \
  timeout 120 bash scripts/make_demo_model.sh "$vl" >"$out/make_vl.log" 2>&1
echo "== demo VL model: rc $?"
if [ -n "$B" ] && [ -x "$S" ]; then
  rm -rf /tmp/m3-jpegs && mkdir -p /tmp/m3-jpegs && "$B" --write-jpegs /tmp/m3-jpegs 48 1080x1920 >/dev/null 2>&1
  if [ "$conc_only" != 1 ]; then
    timeout 240 python3 tools/bench_media/media_ttft.py --m3serve "$S" --model "$vl" \
      --template tests/chat_template/m3_format_synthetic.jinja --jpegs /tmp/m3-jpegs --images 8 --reps 5 \
      --device cuda --serve-arg=--media-threads --serve-arg=8 >"$out/media_ttft.txt" 2>&1
    echo "== media_ttft (cuda, 8 × 1080p): rc $?"
    # The whole report: TTFTs, then the images request stage by stage (request_stage_seconds: body receive,
    # dispatch, parse, template, media collect / queue / load / hash / process with its user and system CPU time /
    # expand, tokenise, submit), the serial sum with the engine's own TTFT, and client TTFT − engine TTFT per kind.
    cat "$out/media_ttft.txt"
  fi
  # Does the engine wait for preprocessing? Text streams' inter-token latency while 8-image requests are decoded
  # (media_concurrency.py: one reader process per stream, bodies encoded up front; streams capped at --tokens and
  # closed when the images phase ends) against the same streams alone for as long.
  timeout 180 python3 tools/bench_media/media_concurrency.py --m3serve "$S" --model "$vl" \
    --template tests/chat_template/m3_format_synthetic.jinja --jpegs /tmp/m3-jpegs --images 8 --requests 3 \
    --streams 4 --tokens 4096 --device cuda --serve-arg=--media-threads --serve-arg=8 >"$out/media_conc.txt" 2>&1
  echo "== media_concurrency (cuda, 4 streams, 3 × 8 × 1080p): rc $?"
  cat "$out/media_conc.txt"
fi
echo "total $(( $(date +%s) - t0 )) s; record the results in bench/results/ (date, GPU, commit, command)"
