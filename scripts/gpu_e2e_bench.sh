#!/usr/bin/env bash
# The end-to-end GPU benchmark of issue 9 (docs/BENCHMARKS.md): on the device machine, in one call, build m3serve
# with CUDA, then for every entry of the plan start `m3serve serve` on a full-width M3 slice with dummy weights,
# drive it with `m3serve bench-serve`, keep its /metrics and its GPU step profile (M3_STEP_PROFILE=1), stop it, and
# write everything plus a report into OUTDIR. Stays inside a time budget: entries that no longer fit are skipped
# with a note.
#
#   bash scripts/gpu_e2e_bench.sh OUTDIR
#
# env (defaults in brackets):
#   M3_E2E_PLAN     ["msa:8,1,32 dense:8 msa-v1:8 msa:long"] entries BACKEND:C1,C2,… (agentic traffic at those
#                   concurrencies) or BACKEND:long (one long request); BACKEND = msa | msa-v1 | dense (serve --attention)
#   M3_E2E_BUDGET   [540] seconds for the whole script, build included
#   M3_E2E_LONG     [1000000] prompt tokens of the long request;  M3_E2E_LONG_OUTPUT [32] its output tokens
#   M3_E2E_PREFIX   [60000] shared prefix; M3_E2E_SUFFIX_MIN/MAX [1000/2000] new tokens per turn;
#   M3_E2E_OUTPUT   [300] output tokens per turn; M3_E2E_TURNS [2] turns per session (sessions = concurrency)
#   M3_E2E_PROMPT_FORMAT [text] text (the server tokenises: preprocess is measured) or ids
#   M3_E2E_LAYERS   [5] serve --num-layers;  M3_E2E_DTYPE [bfloat16];  M3_E2E_KV_MEMORY [32GiB] --kv-cache-memory
#   M3_E2E_MODEL    [models/m3-full] config dir (cuda; --load-format dummy);  M3_E2E_TOKENIZER [the carried o200k]
#   M3_E2E_BATCHED_TOKENS [8192] serve --max-num-batched-tokens (the server's default 2048 would cut a 1M prefill
#                   into 489 steps)
#   M3_E2E_MIN_RUN [40] / M3_E2E_LONG_MIN [120] seconds of budget an agentic / the long run needs to start
#   M3_E2E_RESTART  [1] one server per run (a clean GPU profile per run); 0: one server per plan entry
#   M3_E2E_DEVICE   [cuda] cpu = dry run of the same path on this machine with the demo model (small counts: set
#                   the sizes above; --load-format/--num-layers/--dtype/--attention are not passed)
#   M3_E2E_M3SERVE  a built m3serve to use instead of building;  M3_E2E_BUILD_DIR [build-gpu]
#   M3_E2E_CHAT_TEMPLATE  --chat-template for serve [a placeholder when the model dir has none: the traffic uses
#                   /v1/completions and never renders it]
#   M3_E2E_EXTRA_SERVE_ARGS  more `serve` arguments;  M3_JOBS [16];  M3_COMMIT (recorded)
# Output: OUTDIR/summary.md, OUTDIR/e2e_runs.json, OUTDIR/<date>-e2e-<gpu>.md + e2e_latest.json (scripts/e2e_report.py),
#         OUTDIR/runs/NN-*/ (bench.json, requests.jsonl, server.log, metrics.txt, meta.json) and build.log.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-$root/out/e2e}}"
mkdir -p "$out/runs"
out="$(cd "$out" && pwd)"
t0=$(date +%s)
budget="${M3_E2E_BUDGET:-540}"
device="${M3_E2E_DEVICE:-cuda}"
plan="${M3_E2E_PLAN:-msa:8,1,32 dense:8 msa-v1:8 msa:long}"
long_tokens="${M3_E2E_LONG:-1000000}"
long_output="${M3_E2E_LONG_OUTPUT:-32}"
prefix="${M3_E2E_PREFIX:-60000}"
suffix_min="${M3_E2E_SUFFIX_MIN:-1000}"
suffix_max="${M3_E2E_SUFFIX_MAX:-2000}"
output="${M3_E2E_OUTPUT:-300}"
turns="${M3_E2E_TURNS:-2}"
prompt_format="${M3_E2E_PROMPT_FORMAT:-text}"
layers="${M3_E2E_LAYERS:-5}"
dtype="${M3_E2E_DTYPE:-bfloat16}"
kv_memory="${M3_E2E_KV_MEMORY-32GiB}"
restart="${M3_E2E_RESTART:-1}"
batched="${M3_E2E_BATCHED_TOKENS:-8192}"  # tokens per engine step: prefill chunks of the warm-up and the long request
jobs="${M3_JOBS:-16}"
py="${PYTHON:-python3}"
summary="$out/summary.md"
: >"$summary"
say() { echo "$@" | tee -a "$summary"; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
commit="${M3_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
command_line="M3_E2E_PLAN='$plan' M3_E2E_BUDGET=$budget M3_E2E_LONG=$long_tokens M3_E2E_DEVICE=$device bash scripts/gpu_e2e_bench.sh \$OUT"

say "# m3serve end-to-end benchmark $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "commit: $commit | device: $device | plan: $plan | budget: ${budget} s"
if [ "$device" = cuda ]; then
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$out/env.txt" 2>&1
else
  gpu="cpu ($(nproc) cores)"
  echo "cpu dry run: $(nproc) cores" >"$out/env.txt"
fi
gpu="${gpu:-unknown GPU}"
say "gpu: $gpu"
notes=()

# ---- build ----------------------------------------------------------------------------------------------------------
m3="${M3_E2E_M3SERVE:-}"
if [ -z "$m3" ]; then
  build="${M3_E2E_BUILD_DIR:-$root/build-gpu}"
  cuda_flag=-DM3_WITH_CUDA=ON
  if [ "$device" = cuda ]; then
    . "$root/scripts/gpu_env.sh"
  else
    cmake_extra=()
    cuda_flag=-DM3_WITH_CUDA=OFF
  fi
  tb=$(date +%s)
  if cmake -S "$root" -B "$build" "$cuda_flag" -DCMAKE_BUILD_TYPE=Release "${cmake_extra[@]}" >"$out/build.log" 2>&1 &&
     cmake --build "$build" -j"$jobs" --target m3serve >>"$out/build.log" 2>&1; then
    say "build: ok ($(( $(date +%s) - tb )) s)"
  else
    say "build: FAILED ($(( $(date +%s) - tb )) s) — see build.log:"
    grep -E "error|Error" "$out/build.log" | head -20 | tee -a "$summary"
    exit 1
  fi
  m3="$build/bin/m3serve"
fi
[ -x "$m3" ] || { say "no m3serve binary at $m3"; exit 1; }

# ---- model and tokenizer ------------------------------------------------------------------------------------------
serve_model=()
if [ "$device" = cuda ]; then
  model="${M3_E2E_MODEL:-$root/models/m3-full}"
  tok="${M3_E2E_TOKENIZER:-}"
  if [ -z "$tok" ]; then
    gz="$root/.gpucarry/tokenizer-o200k/tokenizer.json.gz"
    [ -f "$gz" ] || { say "missing $gz: run scripts/gpu_carry.sh and carry .gpucarry"; exit 1; }
    mkdir -p /tmp/m3-e2e-tok && gzip -dc "$gz" >/tmp/m3-e2e-tok/tokenizer.json
    tok=/tmp/m3-e2e-tok/tokenizer.json
  fi
  serve_model=(--model "$model" --tokenizer "$tok" --device cuda --load-format dummy --num-layers "$layers"
               --dtype "$dtype")
  # `serve` needs a chat template to start (the model's, or --chat-template); bench-serve drives /v1/completions, so
  # a config-only model dir gets a plain placeholder that the traffic never renders.
  tmpl="${M3_E2E_CHAT_TEMPLATE:-}"
  if [ -z "$tmpl" ] && [ ! -f "$model/chat_template.jinja" ]; then
    tmpl=/tmp/m3-e2e-tok/bench_placeholder.jinja
    mkdir -p /tmp/m3-e2e-tok
    printf '%s' '{% for m in messages %}{{ m.content }}{% endfor %}' >"$tmpl"
  fi
  [ -z "$tmpl" ] || serve_model+=(--chat-template "$tmpl")
else
  model="${M3_E2E_MODEL:-$root/models/demo}"
  [ -f "$model/config.json" ] || PYTHON=/usr/bin/python3 bash "$root/scripts/make_demo_model.sh" "$model" >>"$out/build.log" 2>&1
  serve_model=(--model "$model" --device cpu)
  layers=$("$py" -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config",c)["num_hidden_layers"])' \
    "$model/config.json")
  dtype=float32
  [ -z "${M3_E2E_TOKENIZER:-}" ] || serve_model+=(--tokenizer "$M3_E2E_TOKENIZER")
  notes+=("cpu dry run: the backend names are labels only (--attention, --load-format, --num-layers, --dtype not passed)")
fi
[ -z "$kv_memory" ] || serve_model+=(--kv-cache-memory "$kv_memory")
extra=()
[ -z "${M3_E2E_EXTRA_SERVE_ARGS:-}" ] || read -r -a extra <<<"$M3_E2E_EXTRA_SERVE_ARGS"
say "model: $model (layers ${layers}, dtype ${dtype}) | tokenizer: ${tok:-from the model dir}"

# ---- servers ------------------------------------------------------------------------------------------------------
port=$(( 18300 + RANDOM % 500 ))
spid=""
server_log=""
start_server() {  # $1 backend, $2 max_model_len, $3 log file; sets spid, returns 0 when /health answers
  local backend="$1" maxlen="$2" log="$3" wait_s
  port=$(( port + 1 ))
  local args=("${serve_model[@]}" --port "$port" --max-model-len "$maxlen" --served-model-name m3-e2e
              --shutdown-timeout 5 --max-num-batched-tokens "$batched" "${extra[@]}")
  [ "$device" = cuda ] && args+=(--attention "$backend")
  echo "serve ${args[*]}" >"$log"
  M3_STEP_PROFILE="${M3_STEP_PROFILE:-1}" "$m3" serve "${args[@]}" >>"$log" 2>&1 &
  spid=$!
  server_log="$log"
  wait_s=$(( $(left) - 20 ))
  [ "$wait_s" -gt 240 ] && wait_s=240
  local ts=$(date +%s)
  while [ $(( $(date +%s) - ts )) -lt "$wait_s" ]; do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
      startup_s=$(( $(date +%s) - ts ))
      return 0
    fi
    kill -0 "$spid" 2>/dev/null || { spid=""; return 1; }
    sleep 0.5
  done
  return 1
}
stop_server() {  # SIGTERM (the executor logs its GPU profile at exit), then SIGKILL after 30 s
  [ -n "$spid" ] || return 0
  kill -TERM "$spid" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$spid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$spid" 2>/dev/null && { kill -KILL "$spid" 2>/dev/null; echo "(killed after 30 s)" >>"$server_log"; }
  wait "$spid" 2>/dev/null
  spid=""
}
trap 'stop_server' EXIT

# ---- the plan -----------------------------------------------------------------------------------------------------
run_no=0
agentic_len=$(( prefix + turns * suffix_max + output + 1024 ))
long_len=$(( long_tokens + long_output + 1024 ))
min_run=${M3_E2E_MIN_RUN:-40}    # an agentic run needs at least this much budget left to start
long_min=${M3_E2E_LONG_MIN:-$(( min_run > 120 ? min_run : 120 ))}  # the long run (a 1M prefill takes minutes)
json_str() { "$py" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
for entry in $plan; do
  backend="${entry%%:*}"
  what="${entry#*:}"
  [ "$what" != "$entry" ] || what=8
  if [ "$what" = long ]; then runs=(long); maxlen=$long_len; else IFS=, read -r -a runs <<<"$what"; maxlen=$agentic_len; fi
  entry_server=0
  for conc in "${runs[@]}"; do
    run_no=$(( run_no + 1 ))
    traffic=agentic; [ "$conc" = long ] && traffic=long
    name="$(printf '%02d' $run_no)-$backend-$traffic$([ "$traffic" = agentic ] && echo "-c$conc")"
    dir="$out/runs/$name"
    need=$min_run; [ "$traffic" = long ] && need=$long_min
    if [ "$(left)" -lt "$need" ]; then
      say "skip $name: $(left) s of the budget left (< $need s)"
      notes+=("skipped $name: out of time budget")
      continue
    fi
    mkdir -p "$dir"
    echo "start $name at +$(( $(date +%s) - t0 )) s" >>"$summary"
    status=ok
    startup_s=0
    if [ "$restart" = 1 ] || [ "$entry_server" = 0 ]; then
      stop_server
      if ! start_server "$backend" "$maxlen" "$dir/server.log"; then
        status="server did not start"
        say "run $name: $status — tail of server.log:"
        tail -5 "$dir/server.log" | tee -a "$summary"
        stop_server
        notes+=("$name: server did not start")
        printf '{"name":%s,"backend":%s,"traffic":"%s","concurrency":%s,"status":%s}\n' "$(json_str "$name")" \
          "$(json_str "$backend")" "$traffic" "$([ "$traffic" = long ] && echo 1 || echo "$conc")" \
          "$(json_str "$status")" >"$dir/meta.json"
        continue
      fi
      entry_server=1
    else
      cp "$server_log" "$dir/server.log.shared" 2>/dev/null
    fi
    bargs=(--base-url "http://127.0.0.1:$port" --prompt-format "$prompt_format" --json "$dir/bench.json"
           --output-file "$dir/requests.jsonl" --tag "backend=$backend" --seed 1)
    if [ "$traffic" = long ]; then
      bargs+=(--traffic long --prompt-tokens "$long_tokens" --output-len "$long_output" --concurrency 1)
      c=1
    else
      bargs+=(--traffic agentic --concurrency "$conc" --shared-prefix-len "$prefix" --suffix-len-min "$suffix_min"
              --suffix-len-max "$suffix_max" --output-len "$output" --turns "$turns")
      c=$conc
    fi
    hard=$(( $(left) - 10 ))
    soft=$(( hard - 25 )); [ "$soft" -lt 5 ] && soft=5
    bargs+=(--max-duration "$soft")
    tr=$(date +%s)
    echo "bench-serve ${bargs[*]}" >"$dir/bench.log"
    timeout --signal=TERM "$hard" "$m3" bench-serve "${bargs[@]}" >>"$dir/bench.log" 2>&1
    rc=$?
    bench_s=$(( $(date +%s) - tr ))
    curl -s "http://127.0.0.1:$port/metrics" >"$dir/metrics.txt" 2>/dev/null
    if [ "$rc" = 124 ]; then status="timed out after ${hard} s (budget)"; notes+=("$name: bench-serve killed at the budget")
    elif [ "$rc" != 0 ]; then status="bench-serve exit $rc"; fi
    [ -f "$dir/bench.json" ] || status="$status; no bench.json"
    profile=""
    if [ "$restart" = 1 ] || [ "$conc" = "${runs[-1]}" ]; then
      stop_server
      # The executor logs its step profile at exit ("gpu step profile (at exit): decode N steps, X ms/step: …"); with
      # M3_E2E_RESTART=0 it covers every run of the entry and is attached to the entry's last run.
      profile="$(grep -h "gpu step profile" "$server_log" 2>/dev/null | tail -1 | sed 's/.*gpu step profile[^:]*: //')"
    fi
    describe="$(grep -h -m1 "m3serve: serving" "$server_log" 2>/dev/null)"
    printf '{"name":%s,"backend":%s,"traffic":"%s","concurrency":%s,"status":%s,"startup_s":%s,"bench_s":%s,"gpu_profile":%s,"server_line":%s,"own_server":%s}\n' \
      "$(json_str "$name")" "$(json_str "$backend")" "$traffic" "$c" "$(json_str "$status")" "$startup_s" "$bench_s" \
      "$(json_str "$profile")" "$(json_str "$describe")" "$([ "$restart" = 1 ] && echo true || echo false)" >"$dir/meta.json"
    say "run $name: $status (server up in ${startup_s} s, bench ${bench_s} s, done at +$(( $(date +%s) - t0 )) s)"
    grep -E "Successful|Failed|Output token throughput|Median TTFT|P99 TTFT|Median TPOT|P99 TPOT|hit rate|KV cache" \
      "$dir/bench.log" | sed 's/^/    /' | tee -a "$summary" >/dev/null
    [ -z "$profile" ] || echo "    gpu profile: $profile" >>"$summary"
  done
done
stop_server

# ---- collect and report ---------------------------------------------------------------------------------------------
notes_json="$("$py" -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${notes[@]}")"
"$py" - "$out" "$commit" "$gpu" "$device" "$plan" "$command_line" "$notes_json" "$model" "$layers" "$dtype" <<'PY'
import datetime, glob, json, os, sys
out, commit, gpu, device, plan, cmd, notes, model, layers, dtype = sys.argv[1:11]
runs = []
for d in sorted(glob.glob(os.path.join(out, "runs", "*"))):
    meta_p = os.path.join(d, "meta.json")
    if not os.path.exists(meta_p):
        continue
    try:
        meta = json.load(open(meta_p))
    except ValueError as e:
        meta = {"name": os.path.basename(d), "backend": "?", "traffic": "?", "concurrency": 0, "status": f"bad meta.json: {e}"}
    bp = os.path.join(d, "bench.json")
    try:
        meta["bench"] = json.load(open(bp)) if os.path.exists(bp) else None
    except ValueError:
        meta["bench"] = None
    runs.append(meta)
now = datetime.datetime.now(datetime.timezone.utc)
doc = {"schema": "m3serve-e2e/1", "date": now.strftime("%Y-%m-%d"), "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "gpu": gpu,
       "device": device, "plan": plan, "command": cmd, "model": os.path.basename(model.rstrip("/")),
       "num_layers": int(layers), "dtype": dtype, "notes": json.loads(notes), "runs": runs}
json.dump(doc, open(os.path.join(out, "e2e_runs.json"), "w"), indent=2)
print(f"e2e_runs.json: {len(runs)} runs")
PY
# A device run's report merges its records into the repository's latest ones (other traffic / backends stay); a
# CPU dry run starts empty.
if [ "$device" = cuda ] && [ ! -f "$out/e2e_latest.json" ]; then
  cp "$root/bench/results/e2e_latest.json" "$out/" 2>/dev/null || true
fi
if "$py" "$root/scripts/e2e_report.py" "$out/e2e_runs.json" --model-config "$model/config.json" \
     --num-layers "$layers" --results-dir "$out" >>"$summary" 2>&1; then
  say "report: $(ls "$out"/*-e2e-*.md 2>/dev/null | head -1)"
else
  say "report: FAILED (see summary.md)"
fi
say "total: $(( $(date +%s) - t0 )) s"
cat "$summary"
