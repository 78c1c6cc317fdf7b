#!/usr/bin/env bash
# Mutation check: do the tests fail when users would be hurt? Applies each small, plausible bug of the catalogue
# below to a scratch copy of this tree, rebuilds only the test binaries that should catch it, runs only those tests,
# and prints CAUGHT / SURVIVED per mutation and a summary. Not in CI (minutes on 2 cores); run it when a subsystem
# changes and record the result in docs/TESTING.md.
#
#   scripts/mutation_check.sh                  # every mutation
#   scripts/mutation_check.sh penalty-sign …   # only these ids
#   scripts/mutation_check.sh --list           # the catalogue
#
# Env: M3_MUTATION_DIR (scratch copy + build, default /tmp/m3-mutation-$USER), M3_JOBS (build jobs, 2),
#      M3_MUTATION_TIMEOUT (seconds per test binary run, 120; a hang counts as caught).
# Exit status: 0 when every mutation was caught (or is marked equivalent), 1 otherwise, 2 on a setup error
# (baseline tests failing, a mutation whose text no longer appears exactly once: update the catalogue).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${M3_MUTATION_DIR:-/tmp/m3-mutation-${USER:-$(id -un)}}"
jobs="${M3_JOBS:-2}"
tmo="${M3_MUTATION_TIMEOUT:-120}"

# ---- catalogue -----------------------------------------------------------------------------------------------------
# mut ID FILE FROM TO TESTS [EQUIVALENT-REASON]
#   FROM must occur exactly once in FILE; TESTS: space-separated "binary[:gtest_filter]", binary relative to the
#   build dir (its basename is the build target). A mutation with a reason is expected to survive (equivalent).
ids=() files=() froms=() tos=() tests=() equiv=()
mut() {
  ids+=("$1") files+=("$2") froms+=("$3") tos+=("$4") tests+=("$5") equiv+=("${6:-}")
}
E=tests/engine
K=tests/kv
O=tests/backend
# Sampler (src/engine/sampler.cpp)
mut sampler-temperature-multiplies src/engine/sampler.cpp \
  '(double(logits[idx[i]]) - m) / double(p.temperature)' '(double(logits[idx[i]]) - m) * double(p.temperature)' \
  "$E/sampler_test:SamplerDistribution.*"
mut sampler-top-p-drops-crossing-token src/engine/sampler.cpp \
  'cut = i + 1;' 'cut = std::max<size_t>(i, 1);' "$E/sampler_test:SamplerDistribution.*:Sampler.TopP*"
mut sampler-top-p-not-renormalised src/engine/sampler.cpp \
  'const double r = u * total;' 'const double r = u;' \
  "$E/sampler_test:SamplerDistribution.*"
mut sampler-min-p-absolute src/engine/sampler.cpp \
  'const double floor = p.min_p * prob[0];' 'const double floor = p.min_p;' "$E/sampler_test:Sampler.MinP*"
mut sampler-greedy-tie-to-higher-id src/engine/sampler.cpp \
  'if (logits[i] > logits[best]) best = int32_t(i);' 'if (logits[i] >= logits[best]) best = int32_t(i);' \
  "$E/sampler_test:Sampler.Greedy*"
# Logit processing (src/engine/sampler.cpp: penalties, bias, min_tokens, logprobs)
mut penalty-sign-flipped src/engine/sampler.cpp \
  'lg[t] -= p.presence_penalty + p.frequency_penalty * float(n);' \
  'lg[t] += p.presence_penalty + p.frequency_penalty * float(n);' "$E/engine_logits_test"
mut presence-penalty-counts-prompt src/engine/sampler.cpp \
  'for (size_t i = size_t(row.prompt_len); i < row.tokens.size(); ++i) ++counts[row.tokens[i]];' \
  'for (size_t i = 0; i < row.tokens.size(); ++i) ++counts[row.tokens[i]];' "$E/engine_logits_test"
mut frequency-penalty-ignores-count src/engine/sampler.cpp \
  'p.frequency_penalty * float(n)' 'p.frequency_penalty' "$E/engine_logits_test"
mut repetition-penalty-output-only src/engine/sampler.cpp \
  'std::unordered_set<int32_t> seen(row.tokens.begin(), row.tokens.end());' \
  'std::unordered_set<int32_t> seen(row.tokens.begin() + row.prompt_len, row.tokens.end());' "$E/engine_logits_test"
mut repetition-penalty-divides-negative-logits src/engine/sampler.cpp \
  'lg[t] > 0 ? lg[t] / p.repetition_penalty : lg[t] * p.repetition_penalty' 'lg[t] / p.repetition_penalty' \
  "$E/engine_logits_test"
mut logit-bias-subtracted src/engine/sampler.cpp \
  'for (auto [t, b] : p.logit_bias) lg[t] += b;' 'for (auto [t, b] : p.logit_bias) lg[t] -= b;' \
  "$E/engine_logits_test"
mut min-tokens-off-by-one src/engine/sampler.cpp \
  'if (generated < p.min_tokens) {' 'if (generated + 1 < p.min_tokens) {' "$E/engine_logits_test $E/engine_test"
mut min-tokens-ignores-stop-ids src/engine/sampler.cpp \
  'for (int32_t t : p.stop_token_ids) lg[t] = ninf;' '' "$E/engine_logits_test $E/engine_test"
mut logprobs-not-normalised src/engine/sampler.cpp \
  'lp.logprob = float(double(raw[chosen]) - lse);' 'lp.logprob = float(double(raw[chosen]) - m);' \
  "$E/engine_logits_test $E/engine_test:*Logprobs*"
mut logprobs-after-penalties src/engine/sampler.cpp \
  'out.logprob = logprobs_of(raw, out.id, p.top_logprobs);' \
  'out.logprob = logprobs_of(logits, out.id, p.top_logprobs);' "$E/engine_logits_test"
mut engine-validate-penalty-range src/engine/engine.cpp \
  'presence_penalty >= -2.f && presence_penalty <= 2.f' 'presence_penalty >= -20.f && presence_penalty <= 20.f' \
  "$E/engine_logits_test:*Validat*"
# Prefix cache and page accounting (src/kv)
mut prefix-hash-ignores-parent src/kv/prefix_cache.cpp \
  'XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), parent)' \
  'XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), 0)' \
  "$K/prefix_cache_test"
# The same bug seen through the engine alone: cached outputs must equal cold ones for repeated content.
mut prefix-hash-ignores-parent-engine-level src/kv/prefix_cache.cpp \
  'XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), parent)' \
  'XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), 0)' \
  "$E/engine_test:*RepeatedContent*:*EqualPagesAfterDifferentPrefixes*"
mut prefix-match-includes-last-token src/kv/prefix_cache.cpp \
  'const size_t max_pages = (tokens.size() - 1) / B;' 'const size_t max_pages = tokens.size() / B;' \
  "$K/prefix_cache_test"
mut prefix-match-does-not-retain src/kv/prefix_cache.cpp \
  'pool_.retain(it->second.page);' '' "$K/prefix_cache_test $E/engine_test"
mut page-release-never-frees src/kv/page_pool.cpp \
  'if (--refcount_[page] == 0) free_.push_back(page);' '--refcount_[page];' "$K/kv_test $E/engine_test"
# Scheduler (src/engine/scheduler.cpp): step order, token budget, stop checks, pages back on every ending
decode_rows=$'  for (auto& r : running_)\n    if (decoding(*r) && budget > 0) take(*r, 1);\n'
IFS= read -r -d '' prefill_chunks <<'END'
  // 2. Continue chunked prefills of running sequences.
  for (auto& r : running_) {
    if (budget <= 0) break;
    Sequence& s = *r;
    if (s.pending() <= 1) continue;
    const int64_t n = std::min(s.pending(), budget);
    if (!ensure_pages(s, s.computed + n)) continue;  // try again next step (decodes may finish)
    take(s, n);
  }
END
mut scheduler-chunked-prefill-before-decode-rows src/engine/scheduler.cpp \
  "$decode_rows"$'\n'"$prefill_chunks" "$prefill_chunks$decode_rows" "$E/scheduler_test"
mut scheduler-admission-exceeds-token-budget-by-one src/engine/scheduler.cpp \
  $'const int64_t n = std::min(s.pending(), budget);\n    if (!ensure_pages(s, s.computed + n)) {' \
  $'const int64_t n = std::min(s.pending(), budget + 1);\n    if (!ensure_pages(s, s.computed + n)) {' \
  "$E/scheduler_test"
mut max-tokens-one-extra src/engine/scheduler.cpp \
  'else if (s.generated >= p.max_tokens ||' 'else if (s.generated > p.max_tokens ||' "$E/scheduler_test $E/engine_test"
mut scheduler-finish-leaks-pages src/engine/scheduler.cpp \
  $'      free_pages(s, true);\n      done.push_back(&s);' $'      done.push_back(&s);' \
  "$E/scheduler_test $E/engine_test:*PrefixCachingOff*:*Abort*"
mut scheduler-abort-leaves-pages src/engine/scheduler.cpp \
  $'        free_pages(**it, true);\n' '' "$E/scheduler_test:*Abort* $E/engine_test:*Abort*"
mut scheduler-abort-all-leaves-pages src/engine/scheduler.cpp \
  $'    free_pages(*s, true);\n    s->finish = FinishReason::Abort;' $'    s->finish = FinishReason::Abort;' \
  "$E/scheduler_test $E/engine_test"
mut scheduler-failure-leaves-pages src/engine/scheduler.cpp \
  $'    free_pages(*s, false);\n    s->finish = FinishReason::Error;' $'    s->finish = FinishReason::Error;' \
  "$E/scheduler_test"
mut scheduler-preemption-keeps-pages src/engine/scheduler.cpp \
  $'  free_pages(*s, true);\n  s->computed = 0;' $'  s->computed = 0;' "$E/scheduler_test:*Preempt*"
# Step plan (src/model/step_plan.cpp): the rows every executor reads
M=tests/model
mut step-plan-csr-stores-lengths src/model/step_plan.cpp \
  'r.pt_indptr.push_back(int32_t(r.pt_pages.size()));' 'r.pt_indptr.push_back(int32_t(sq.page_table.size()));' \
  "$M/step_plan_test:StepRows.*"
mut step-plan-slot-from-step-offset src/model/step_plan.cpp \
  'r.slot.push_back(sq.page_table[size_t(p / B)]);' 'r.slot.push_back(sq.page_table[size_t(int64_t(i) / B)]);' \
  "$M/step_plan_test:StepRows.*"
# Sampling RNG (src/base/rng.h): the counter hash must depend on seed, choice and step
mut rng-ignores-step src/base/rng.h \
  'splitmix64(splitmix64(step + 0x51ed))' 'splitmix64(splitmix64(0x51ed))' "$E/sampler_test"
mut rng-ignores-choice src/base/rng.h \
  'splitmix64(choice_index + 1)' 'splitmix64(1)' "$E/sampler_test"
mut rng-ignores-seed src/base/rng.h \
  'splitmix64(seed ^ splitmix64(choice_index + 1)' 'splitmix64(splitmix64(choice_index + 1)' "$E/sampler_test"
# Model ops (src/backend/cpu)
mut msa-topk-picks-lowest src/backend/cpu/msa_indexer.cpp \
  'return ka != kb ? ka > kb : a < b;' 'return ka != kb ? ka < kb : a < b;' "$O/ops_test:MsaTopk.*"
mut msa-topk-drops-local-block src/backend/cpu/msa_indexer.cpp \
  'sel[top_k - 1] = local;' 'sel[top_k - 1] = order[top_k - 1];' "$O/ops_test:MsaTopk.*"
mut rope-frequency-over-head-dim src/backend/cpu/norm_rope.cpp \
  'double(2 * i) / double(rotary_dim)' 'double(2 * i) / double(D)' "$O/ops_test:Rope.*"
mut rope-rotation-sign src/backend/cpu/norm_rope.cpp \
  'v[i] = a * cs[i] - b * sn[i];' 'v[i] = a * cs[i] + b * sn[i];' "$O/ops_test:Rope.*"
mut rmsnorm-not-gemma-style src/backend/cpu/norm_rope.cpp \
  'yr[i] = xr[i] * inv * (1.0f + w[i]);' 'yr[i] = xr[i] * inv * w[i];' "$O/ops_test:RmsNorm.*"
mut rmsnorm-eps-outside-sqrt src/backend/cpu/norm_rope.cpp \
  'float(1.0 / std::sqrt(ss / double(D) + double(eps)))' 'float(1.0 / (std::sqrt(ss / double(D)) + double(eps)))' \
  "$O/ops_test:RmsNorm.*"
mut moe-weights-use-biased-scores src/backend/cpu/mlp_moe.cpp \
  'weights[t * top_k + k] = s[order[k]] / sum * scale;' 'weights[t * top_k + k] = choice[order[k]] / sum * scale;' \
  "$O/ops_test:MoeRoute.*"
mut moe-route-ignores-bias src/backend/cpu/mlp_moe.cpp \
  'choice[e] = s[e] + (bias ? bias[e] : 0.0f);' 'choice[e] = s[e];' "$O/ops_test:MoeRoute.*"
mut swiglu-up-upper-clamp-removed src/backend/cpu/mlp_moe.cpp \
  'const float uc = std::clamp(u[i], -limit, limit);' 'const float uc = std::max(u[i], -limit);' \
  "$O/ops_test:SwigluOai.*"
mut swiglu-gate-clamp-removed src/backend/cpu/mlp_moe.cpp \
  'const float gc = std::min(g[i], limit);' 'const float gc = g[i];' "$O/ops_test:SwigluOai.*"
# Text: detokenizer UTF-8 boundaries, stop strings, output parser (src/text, src/server)
mut utf8-incomplete-tail-never-held src/text/tokenizer/tokenizer_utf8.cpp \
  'return utf8_maximal_subpart(s, i) == back ? back : 0;' 'return 0;' "tests/text/detokenizer_test"
mut utf8-tail-lookback-two-bytes src/text/tokenizer/tokenizer_utf8.cpp \
  'for (size_t back = 1; back <= 3 && back <= n; ++back) {' 'for (size_t back = 1; back <= 2 && back <= n; ++back) {' \
  "tests/text/detokenizer_test"
mut stop-string-partial-not-held src/server/choice_stream.cpp \
  'for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {' \
  'for (size_t len = 0; len > keep; --len) {' "tests/server/server_choice_stream_test"
mut stop-string-search-starts-late src/server/choice_stream.cpp \
  'size_t from = old >= s.size() ? old - s.size() + 1 : 0;' 'size_t from = old;' \
  "tests/server/server_choice_stream_test"
mut invoke-scan-restarts-each-push src/text/parsers/m3_output_parser.cpp \
  'size_t from = invoke_scan_;' 'size_t from = 0;' "tests/text/tool_parser_stream_test:*Linear*"
mut invoke-scan-rescans-the-whole-body src/text/parsers/m3_output_parser.cpp \
  'invoke_scan_ = std::max(from, buf_.size() > keep ? buf_.size() - keep : size_t{0});' 'invoke_scan_ = from;' \
  "tests/text/tool_parser_stream_test:*Linear*"
# Request validation (src/server/request_parse.cpp)
mut min-tokens-above-max-accepted src/server/request_parse.cpp \
  'if (r.max_tokens && *m > *r.max_tokens)' 'if (false)' "tests/server/server_request_parse_test"

# ---- driver --------------------------------------------------------------------------------------------------------
if [ "${1:-}" = "--list" ]; then
  for i in "${!ids[@]}"; do printf '%-42s %s\n' "${ids[$i]}" "${files[$i]}"; done
  exit 0
fi
selected=("$@")
want() {
  [ ${#selected[@]} -eq 0 ] && return 0
  local s
  for s in "${selected[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

# Scratch copy: tracked + untracked-but-not-ignored files of this tree as they are now (uncommitted edits included).
# Only files whose content differs are copied, with a fresh mtime: the scratch build stays incremental and never
# keeps an object compiled from a mutant of an earlier, interrupted run.
tree="$work/tree" build="$work/build" incoming="$work/incoming"
rm -rf "$incoming"
mkdir -p "$tree" "$incoming"
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | (cd "$incoming" && tar -xf -)
(cd "$incoming" && find . -type f -print0) | while IFS= read -r -d '' f; do
  cmp -s "$incoming/$f" "$tree/$f" || { mkdir -p "$(dirname "$tree/$f")" && cp "$incoming/$f" "$tree/$f"; }
done
# Files the tree no longer has (moved or deleted since the last run) leave the scratch copy too.
(cd "$tree" && find . -type f -print0) | while IFS= read -r -d '' f; do [ -e "$incoming/$f" ] || rm -f "$tree/$f"; done
[ -e "$tree/tests/npm/node_modules" ] || ln -s "$root/tests/npm/node_modules" "$tree/tests/npm/node_modules"
cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release -DM3_BUILD_TESTS=ON >/dev/null || exit 2

targets_of() { local t; for t in $1; do basename "${t%%:*}"; done | sort -u | tr '\n' ' '; }
# Runs the tests of one spec list; returns 0 when all pass.
run_tests() {
  local spec bin filter rc=0
  for spec in $1; do
    bin="$build/${spec%%:*}"
    filter="*"
    [ "$spec" != "${spec#*:}" ] && filter="${spec#*:}"
    (cd "$tree" && timeout "$tmo" "$bin" --gtest_filter="$filter" --gtest_brief=1 >"$work/last_test.log" 2>&1) || {
      rc=1
      last_failed="${spec%%:*}"
      break
    }
  done
  return $rc
}
build_targets() { cmake --build "$build" -j"$jobs" --target $1 >"$work/last_build.log" 2>&1; }

# Baseline: every test used by the selected mutations must pass on the unmutated tree.
all_tests=""
for i in "${!ids[@]}"; do want "${ids[$i]}" && all_tests+=" ${tests[$i]}"; done
all_tests="$(echo "$all_tests" | tr ' ' '\n' | sort -u | tr '\n' ' ')"
echo "mutation_check: building the baseline in $build"
build_targets "$(targets_of "$all_tests")" || { echo "baseline build failed: $work/last_build.log"; exit 2; }
if ! run_tests "$all_tests"; then
  echo "baseline tests fail ($last_failed): fix them first; log: $work/last_test.log"
  exit 2
fi

last_failed=""
caught=0 survived=0 equivalent=0 total=0 stale=0
results=()
for i in "${!ids[@]}"; do
  id="${ids[$i]}"
  want "$id" || continue
  f="$tree/${files[$i]}"
  total=$((total + 1))
  if ! FROM="${froms[$i]}" TO="${tos[$i]}" python3 - "$f" <<'EOF'
import os, sys
p = sys.argv[1]
s = open(p, encoding="utf-8").read()
if s.count(os.environ["FROM"]) != 1:
    sys.exit(1)
open(p, "w", encoding="utf-8").write(s.replace(os.environ["FROM"], os.environ["TO"]))
EOF
  then
    echo "STALE     $id: the text to mutate no longer appears exactly once in ${files[$i]}"
    stale=$((stale + 1))
    continue
  fi
  t0=$(date +%s)
  verdict=""
  if ! build_targets "$(targets_of "${tests[$i]}")"; then
    verdict="CAUGHT    $id (does not compile)"
    caught=$((caught + 1))
  elif run_tests "${tests[$i]}"; then
    if [ -n "${equiv[$i]}" ]; then
      verdict="EQUIVALENT $id: ${equiv[$i]}"
      equivalent=$((equivalent + 1))
    else
      verdict="SURVIVED  $id (ran: ${tests[$i]})"
      survived=$((survived + 1))
    fi
  else
    verdict="CAUGHT    $id (by $(basename "$last_failed"))"
    caught=$((caught + 1))
  fi
  cp "$root/${files[$i]}" "$f"  # restore (a fresh mtime, so the next build recompiles it)
  echo "$verdict [$(($(date +%s) - t0)) s]"
  results+=("$verdict")
done
# Leave the scratch build matching the unmutated tree.
build_targets "$(targets_of "$all_tests")" >/dev/null 2>&1 || true

commit="$(cd "$root" && git rev-parse --short HEAD)$(cd "$root" && git diff --quiet HEAD -- . || echo '+dirty')"
echo "mutation_check $(date -u +%Y-%m-%d) at $commit: $caught caught / $total, $survived survived, $equivalent equivalent," \
  "$stale stale"
[ "$stale" -eq 0 ] || exit 2
[ "$survived" -eq 0 ] || exit 1
exit 0
