#include "server/openai_service.h"

#include <chrono>
#include <cmath>

#include "base/error.h"
#include "grammar/constraint.h"
#include "grammar/tokenizer_vocab.h"
#include "text/parsers/tool_parser.h"

namespace m3::server {

namespace {

std::string dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

std::string sse(const OJson& j) { return "data: " + dump(j) + "\n\n"; }

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool ends_in_reasoning(const std::string& prompt) {
  size_t end = prompt.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return false;
  std::string_view p(prompt.data(), end + 1);
  return p.size() >= kThinkOpen.size() && p.substr(p.size() - kThinkOpen.size()) == kThinkOpen;
}

}  // namespace

OpenAIService::OpenAIService(ServiceConfig cfg) : cfg_(std::move(cfg)) {
  M3_CHECK(cfg_.tokenizer != nullptr, "OpenAIService needs a tokenizer");
  if (cfg_.created == 0) cfg_.created = now_seconds();
  if (!cfg_.content_format)
    cfg_.content_format = cfg_.chat_template ? detect_content_format(*cfg_.chat_template) : ContentFormat::kString;
}

std::string OpenAIService::render_chat(const ParsedRequest& r, bool allow_media) const {
  return render_chat_impl(r, allow_media, nullptr);
}

std::vector<MediaSpan> OpenAIService::media_spans(std::span<const int32_t> ids, const MediaPrepared& m) const {
  std::vector<MediaSpan> out;
  size_t item = 0;
  int64_t left = m.slots.empty() ? 0 : m.slots[0];
  auto is_slot = [&](int32_t id) { return id >= 0 && (id == cfg_.image_token_id || id == cfg_.video_token_id); };
  for (size_t i = 0; i < ids.size();) {
    if (!is_slot(ids[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < ids.size() && is_slot(ids[j])) ++j;
    // One run: a whole image, one video group, or (never in M3's layout) several items back to back.
    for (int64_t at = int64_t(i); at < int64_t(j);) {
      if (item >= m.slots.size())
        throw ApiError(500, "The tokenised prompt has more image/video slot tokens than the media items need");
      const int64_t n = std::min<int64_t>(left, int64_t(j) - at);
      out.push_back(MediaSpan{at, n, item < m.hashes.size() ? m.hashes[item] : 0});
      at += n;
      left -= n;
      if (left == 0 && ++item < m.slots.size()) left = m.slots[item];
    }
    i = j;
  }
  if (item < m.slots.size())
    throw ApiError(500, fmt::format("The tokenised prompt has fewer image/video slot tokens than the {} media "
                                    "item(s) need (does the tokenizer map the slot token to id {}?)",
                                    m.slots.size(), cfg_.image_token_id));
  return out;
}

std::string OpenAIService::render_chat_impl(const ParsedRequest& r, bool allow_media, MediaPrepared* media) const {
  if (!cfg_.chat_template)
    throw ApiError(400,
                   "This model has no chat template (no chat_template.jinja or tokenizer_config.json chat_template "
                   "in the model directory); use /v1/completions or start the server with --chat-template FILE",
                   "messages", "no_chat_template");
  const auto t0 = std::chrono::steady_clock::now();
  ChatPrompt p = render_chat_prompt(*cfg_.chat_template, *cfg_.content_format, r);
  timings_->observe_stage(RequestStage::kTemplate, seconds_since(t0));
  if (p.media.empty() || allow_media) return std::move(p.text);
  if (cfg_.prepare_media) {
    MediaPrepared prepared;
    try {
      prepared = cfg_.prepare_media(r.messages, std::move(p.text));
    } catch (const ApiError&) {
      throw;
    } catch (const m3::Error& e) {
      throw ApiError(400, fmt::format("Invalid media input: {}", e.what()), "messages", "invalid_media");
    }
    if (prepared.gateway_seconds > 0 || prepared.encode_seconds > 0) {
      timings_->observe_media_gateway(prepared.gateway_seconds, int64_t(prepared.hashes.size()));
      if (!prepared.encode) timings_->observe_media_encode(prepared.encode_seconds, prepared.items_encoded);
      const auto& st = prepared.stages;
      using S = RequestStage;
      for (auto [stage, v] : {std::pair{S::kMediaCollect, st.collect}, {S::kMediaQueue, st.queue},
                              {S::kMediaLoad, st.load}, {S::kMediaHash, st.hash}, {S::kMediaProcess, st.process},
                              {S::kMediaProcessUser, st.process_user}, {S::kMediaProcessSys, st.process_sys},
                              {S::kMediaExpand, st.expand}})
        timings_->observe_stage(stage, v);
    }
    if (cfg_.serve_media) {
      std::string expanded = prepared.prompt;
      if (media) *media = std::move(prepared);
      return expanded;
    }
    throw ApiError(400,
                   fmt::format("Image and video input is not supported by this model backend yet (the {} "
                               "image/video part(s) are valid, but the vision tower does not run here)",
                               p.media.size()),
                   "messages", "unsupported_parameter");
  }
  throw ApiError(400,
                 fmt::format("Image and video input is not supported by this server yet (text only); the "
                             "messages have {} image/video part(s)",
                             p.media.size()),
                 "messages", "unsupported_parameter");
}

bool OpenAIService::prepare_may_block(ApiKind kind, std::string_view body) const {
  return kind == ApiKind::Chat && cfg_.prepare_media &&
         (body.find("image") != std::string_view::npos || body.find("video") != std::string_view::npos);
}

std::shared_ptr<grammar::CompiledGrammar> OpenAIService::compiled_grammar(const ParsedRequest& r) const {
  std::call_once(vocab_once_, [&] {
    const int32_t size = cfg_.limits.vocab_size > 0 ? cfg_.limits.vocab_size : int32_t(cfg_.tokenizer->vocab_size());
    vocab_ = grammar::vocab_from_tokenizer(*cfg_.tokenizer, size, cfg_.eos_token_id, {std::string(kM3Namespace)});
  });
  std::lock_guard<std::mutex> lk(grammar_mu_);
  if (auto it = grammars_.find(r.grammar_key); it != grammars_.end()) {
    if (!it->second->oversized()) return it->second;
    grammars_.erase(it);  // a fresh one for new requests; running ones keep the old
  }
  std::shared_ptr<grammar::CompiledGrammar> g;
  try {
    g = std::make_shared<grammar::CompiledGrammar>(*r.grammar, vocab_);
  } catch (const m3::Error& e) {  // e.g. a schema that recurses without consuming input
    throw ApiError(400, fmt::format("the requested output format cannot be compiled: {}", e.what()),
                   "response_format", "unsupported_parameter");
  }
  if (grammars_.size() >= kGrammarCacheSize) grammars_.clear();
  grammars_.emplace(r.grammar_key, g);
  return g;
}

PreparedJob OpenAIService::prepare(ApiKind kind, std::string_view body) const {
  const auto t0 = std::chrono::steady_clock::now();
  PreparedJob job = prepare_impl(kind, body);  // failures (ApiError) are not timed
  timings_->observe_preprocess(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return job;
}

PreparedJob OpenAIService::prepare_impl(ApiKind kind, std::string_view body) const {
  PreparedJob job;
  auto t = std::chrono::steady_clock::now();
  job.req = kind == ApiKind::Chat ? parse_chat_request(body, cfg_.limits) : parse_completion_request(body, cfg_.limits);
  timings_->observe_stage(RequestStage::kParse, seconds_since(t));
  const ParsedRequest& r = job.req;
  const Tokenizer& tok = *cfg_.tokenizer;
  const uint64_t serial = next_id_.fetch_add(1);
  job.id = fmt::format("{}-{:x}{:06x}", kind == ApiKind::Chat ? "chatcmpl" : "cmpl", uint64_t(now_seconds()), serial);
  job.created = now_seconds();

  struct Prompt {
    std::vector<int32_t> ids;
    std::string text;
    bool in_reasoning = false;
  };
  std::vector<Prompt> prompts;
  MediaPrepared media;  // chat with served media: hashes, slot counts, features
  std::vector<MediaSpan> spans;
  if (kind == ApiKind::Chat) {
    Prompt p;
    p.text = render_chat_impl(r, false, &media);
    // Only the generation prompt (template text) can open the think block: without it the prompt ends in client
    // text, and a <mm:think> the client wrote there must not change how the output is parsed.
    p.in_reasoning = r.add_generation_prompt && ends_in_reasoning(p.text);
    // The template already wrote any BOS / special tokens, so do not add them again (HF and vLLM agree).
    t = std::chrono::steady_clock::now();
    p.ids = encode_chat_prompt(p.text);
    if (media.embeds || media.encode) spans = media_spans(p.ids, media);
    timings_->observe_stage(RequestStage::kTokenize, seconds_since(t));
    prompts.push_back(std::move(p));
  } else {
    t = std::chrono::steady_clock::now();
    for (const auto& in : r.prompts) {
      Prompt p;
      if (const auto* s = std::get_if<std::string>(&in)) {
        p.text = *s;
        // Agents resend a growing prompt: resume at the longest cached prefix (id-exact; text/tokenizer).
        p.ids = cfg_.tokenizer_prefix_cache ? tok.encode_cached(*s, true) : tok.encode(*s, true);
      } else {
        p.ids = std::get<std::vector<int32_t>>(in);
        if (r.echo) p.text = tok.decode(p.ids, r.skip_special_tokens);
      }
      prompts.push_back(std::move(p));
    }
    timings_->observe_stage(RequestStage::kTokenize, seconds_since(t));
  }

  // Features on demand: the engine asks for the items its prefix cache does not hold; each call is timed here.
  std::shared_ptr<const MediaEncoder> encoder;
  if (media.encode && !spans.empty()) {
    auto me = std::make_shared<MediaEncoder>();
    me->item_slots = media.slots;
    me->encode = [encode = media.encode, timings = timings_](size_t first, size_t end, MediaEncoder::Done done) {
      encode(first, end, [timings, done = std::move(done)](MediaPrepared::Encoded e) {
        if (e.error.empty()) timings->observe_media_encode(e.seconds, e.items_encoded);
        done(std::move(e.features), std::move(e.error));
      });
    };
    encoder = std::move(me);
  }
  std::shared_ptr<grammar::CompiledGrammar> cg = r.grammar ? compiled_grammar(r) : nullptr;
  int choice = 0;
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const int max_tokens = resolve_max_tokens(r, int64_t(prompts[pi].ids.size()), cfg_.limits.max_model_len);
    // The constraint covers the answer (docs/SERVING_FORMAT.md §3.2, docs/SERVER.md): after </mm:think> when the
    // prompt opened reasoning; from the start when it closed it; otherwise (M3's adaptive mode) the model may first
    // open or close reasoning with the marker tokens.
    std::shared_ptr<grammar::ConstraintSpec> spec;
    if (cg) {
      spec = std::make_shared<grammar::ConstraintSpec>();
      spec->grammar = cg;
      spec->think_end = std::string(kThinkClose);
      auto id = [&](std::string_view t) { return tok.token_to_id(t).value_or(-1); };
      spec->think_begin_id = id(kThinkOpen);
      spec->think_end_id = id(kThinkClose);
      const std::string& t = prompts[pi].text;
      const size_t end = t.find_last_not_of(" \t\r\n");
      const bool closed = end != std::string::npos && end + 1 >= kThinkClose.size() &&
                          std::string_view(t).substr(end + 1 - kThinkClose.size(), kThinkClose.size()) == kThinkClose;
      if (prompts[pi].in_reasoning)
        spec->start = grammar::ConstraintSpec::Start::InReasoning;
      else if (kind == ApiKind::Chat && !closed && spec->think_begin_id >= 0)
        spec->start = grammar::ConstraintSpec::Start::Adaptive;
      else
        spec->start = grammar::ConstraintSpec::Start::Answer;
    }
    for (int k = 0; k < r.n; ++k, ++choice) {
      EngineRequest er;
      er.id = fmt::format("{}-{}", job.id, choice);
      er.prompt = prompts[pi].ids;
      er.params = r.gen;
      er.params.max_tokens = max_tokens;
      // The RNG stream is keyed by (seed, choice index): n seeded choices differ from each other but each is
      // reproducible. Choices of different prompts share indices 0..n-1 like separate requests would.
      er.params.choice_index = uint64_t(k);
      er.priority = r.priority;
      er.constraint = spec;
      er.media = spans;
      er.media_embeds = media.embeds;
      er.media_encoder = encoder;
      job.engine_requests.push_back(std::move(er));

      ChoiceOptions o;
      o.chat = kind == ApiKind::Chat;
      o.skip_special_tokens = r.skip_special_tokens;
      o.stop = r.stop;
      o.include_stop_str_in_output = r.include_stop_str_in_output;
      o.starts_in_reasoning = prompts[pi].in_reasoning;
      o.tools = r.tools;
      o.parse_tools = r.parse_tools;
      o.parallel_tool_calls = r.parallel_tool_calls;
      job.choice_options.push_back(std::move(o));
      job.prompt_texts.push_back(prompts[pi].text);
    }
  }
  return job;
}

std::string OpenAIService::models_body() const {
  OJson model = {{"id", cfg_.limits.model_name},
                 {"object", "model"},
                 {"created", cfg_.created},
                 {"owned_by", "m3serve"},
                 {"root", cfg_.limits.model_name},
                 {"parent", nullptr},
                 {"max_model_len", cfg_.limits.max_model_len}};
  return dump(OJson{{"object", "list"}, {"data", OJson::array({model})}});
}

std::vector<int32_t> OpenAIService::encode_chat_prompt(std::string_view text) const {
  return cfg_.tokenizer_prefix_cache ? cfg_.tokenizer->encode_cached(text, false) : cfg_.tokenizer->encode(text, false);
}

std::string OpenAIService::tokenize_body(std::string_view body) const {
  OJson b = parse_json_object(body);
  std::vector<int32_t> ids;
  if (b.contains("messages") && !b["messages"].is_null()) {
    // Chat form: reuse the chat validation and template, then tokenise like /v1/chat/completions does.
    OJson chat = b;
    chat.erase("prompt");
    ParsedRequest r = parse_chat_request(dump(chat), cfg_.limits);
    ids = encode_chat_prompt(render_chat(r));
  } else {
    auto it = b.find("prompt");
    if (it == b.end() || !it->is_string()) bad_field("prompt", "'prompt' (a string) or 'messages' is required");
    bool add_special = true;
    if (auto a = b.find("add_special_tokens"); a != b.end() && !a->is_null()) {
      if (!a->is_boolean()) bad_field("add_special_tokens", "'add_special_tokens' must be a boolean");
      add_special = a->get<bool>();
    }
    if (auto m = b.find("model"); m != b.end() && !m->is_null()) {
      if (!m->is_string()) bad_field("model", "'model' must be a string");
      if (*m != cfg_.limits.model_name)
        throw ApiError(404, fmt::format("The model '{}' does not exist", m->get<std::string>()), "model",
                       "model_not_found");
    }
    ids = cfg_.tokenizer->encode(it->get<std::string>(), add_special);
  }
  return dump(OJson{{"count", ids.size()}, {"max_model_len", cfg_.limits.max_model_len}, {"tokens", ids}});
}

std::string OpenAIService::detokenize_body(std::string_view body) const {
  OJson b = parse_json_object(body);
  auto it = b.find("tokens");
  if (it == b.end() || !it->is_array()) bad_field("tokens", "'tokens' must be an array of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : *it) {
    if (!v.is_number_integer()) bad_field("tokens", "'tokens' must contain integers");
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= int64_t(cfg_.tokenizer->vocab_size()))
      bad_field("tokens", "token id {} is outside the vocabulary [0, {})", id, cfg_.tokenizer->vocab_size());
    ids.push_back(int32_t(id));
  }
  return dump(OJson{{"prompt", cfg_.tokenizer->decode(ids, false)}});
}

// ---------------------------------------------------------------------------------------------------------------

Job::Job(const OpenAIService& svc, PreparedJob prep) : svc_(svc), prep_(std::move(prep)) {
  for (const auto& o : prep_.choice_options) {
    Choice c;
    c.stream = std::make_unique<ChoiceStream>(*svc_.config().tokenizer, o);
    choices_.push_back(std::move(c));
  }
  if (prep_.req.echo)
    for (size_t i = 0; i < choices_.size(); ++i) choices_[i].text = prep_.prompt_texts[i];
}

std::string Job::token_text(int32_t id) const {
  const int32_t one[1] = {id};
  return svc_.config().tokenizer->decode(std::span<const int32_t>(one, 1), false);
}

OJson Job::chat_logprobs(const std::vector<TokenLogprob>& lps) const {
  auto entry = [&](int32_t id, float lp) {
    std::string t = token_text(id);
    OJson bytes = OJson::array();
    for (unsigned char ch : t) bytes.push_back(int(ch));
    // -inf (a token masked out) is not JSON; OpenAI reports -9999.0 for such tokens.
    return OJson{{"token", t}, {"logprob", std::isfinite(lp) ? lp : -9999.0f}, {"bytes", bytes}};
  };
  OJson content = OJson::array();
  for (const auto& lp : lps) {
    OJson e = entry(lp.id, lp.logprob);
    OJson top = OJson::array();
    for (const auto& [id, v] : lp.top) top.push_back(entry(id, v));
    e["top_logprobs"] = top;
    content.push_back(std::move(e));
  }
  return OJson{{"content", content}};
}

OJson Job::completion_logprobs(const std::vector<TokenLogprob>& lps, size_t offset) const {
  OJson tokens = OJson::array(), token_lps = OJson::array(), tops = OJson::array(), offsets = OJson::array();
  for (const auto& lp : lps) {
    std::string t = token_text(lp.id);
    tokens.push_back(t);
    token_lps.push_back(std::isfinite(lp.logprob) ? lp.logprob : -9999.0f);
    OJson top = OJson::object();
    for (const auto& [id, v] : lp.top) top[token_text(id)] = std::isfinite(v) ? v : -9999.0f;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.size();
  }
  return OJson{{"text_offset", offsets}, {"token_logprobs", token_lps}, {"tokens", tokens}, {"top_logprobs", tops}};
}

OJson Job::usage_json() const {
  int prompt = 0, cached = 0, completion = 0, reasoning = 0;
  // Each prompt counts once, however many choices sample from it.
  for (size_t i = 0; i < choices_.size(); ++i) {
    const auto& s = *choices_[i].stream;
    if (i % size_t(prep_.req.n) == 0) {
      prompt += s.prompt_tokens() ? s.prompt_tokens() : int(prep_.engine_requests[i].prompt.size());
      cached += s.cached_tokens();
    }
    completion += s.completion_tokens();
    reasoning += s.reasoning_tokens();
  }
  OJson u = {{"prompt_tokens", prompt},
             {"completion_tokens", completion},
             {"total_tokens", prompt + completion},
             {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  if (prep_.req.kind == ApiKind::Chat) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return u;
}

std::string Job::chunk(const OJson& payload, bool usage) const {
  const bool chat = prep_.req.kind == ApiKind::Chat;
  OJson c = {{"id", prep_.id},
             {"object", chat ? "chat.completion.chunk" : "text_completion"},
             {"created", prep_.created},
             {"model", prep_.req.model}};
  if (usage) {
    c["choices"] = OJson::array();
    c["usage"] = payload;
  } else {
    c["choices"] = payload;
  }
  return sse(c);
}

std::string Job::stream_prologue() {
  if (prep_.req.kind != ApiKind::Chat) return {};
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    OJson ch = {{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                {"finish_reason", nullptr}};
    out += chunk(OJson::array({ch}), false);
  }
  return out;
}

Job::Update Job::on_output(int i, const EngineOutput& out) {
  Update up;
  if (i < 0 || i >= int(choices_.size())) return up;
  Choice& c = choices_[size_t(i)];
  if (c.done) return up;
  const auto t0 = std::chrono::steady_clock::now();
  ChoiceDelta d = c.stream->on_output(out);
  output_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (d.needs_abort) up.abort_ids.push_back(prep_.engine_requests[size_t(i)].id);
  const bool chat = prep_.req.kind == ApiKind::Chat;
  const bool want_lp = prep_.req.logprobs;

  if (prep_.req.stream) {
    const bool has_payload = chat ? !d.parsed.empty() : !d.text.empty();
    if (has_payload || (want_lp && !d.logprobs.empty())) {
      OJson ch = {{"index", i}};
      if (chat) {
        OJson delta = OJson::object();
        if (!d.parsed.reasoning.empty()) {
          delta["reasoning_content"] = d.parsed.reasoning;
          delta["reasoning"] = d.parsed.reasoning;
        }
        if (!d.parsed.content.empty()) delta["content"] = d.parsed.content;
        if (!d.parsed.tool_calls.empty()) {
          OJson calls = OJson::array();
          for (const auto& t : d.parsed.tool_calls) {
            OJson call = {{"index", t.index}};
            if (!t.id.empty()) {
              call["id"] = t.id;
              call["type"] = "function";
              call["function"] = {{"name", t.name}, {"arguments", t.arguments}};
            } else {
              call["function"] = {{"arguments", t.arguments}};
            }
            calls.push_back(std::move(call));
          }
          delta["tool_calls"] = calls;
        }
        ch["delta"] = delta;
        ch["logprobs"] = want_lp ? chat_logprobs(d.logprobs) : OJson(nullptr);
      } else {
        ch["text"] = d.text;
        ch["logprobs"] = want_lp ? completion_logprobs(d.logprobs, c.text.size()) : OJson(nullptr);
        c.text += d.text;  // only its length is used (text_offset)
      }
      ch["finish_reason"] = nullptr;
      up.bytes += chunk(OJson::array({ch}), false);
    }
    if (d.finished) {
      if (d.finish_reason == "error") {
        OJson err = {{"message", d.error}, {"type", "internal_server_error"}, {"param", nullptr}, {"code", 500}};
        up.bytes += "data: " + dump(OJson{{"error", err}}) + "\n\n";
      }
      OJson ch = {{"index", i}};
      if (chat)
        ch["delta"] = OJson::object();
      else
        ch["text"] = "";
      ch["logprobs"] = nullptr;
      ch["finish_reason"] = d.finish_reason;
      up.bytes += chunk(OJson::array({ch}), false);
    }
  } else {
    if (chat)
      c.message.append(d.parsed);
    else
      c.text += d.text;
    if (want_lp) c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  }
  if (d.finished) {
    c.done = true;
    c.finish_reason = d.finish_reason;
    c.error = d.error;
    ++finished_;
    if (done()) svc_.timings().observe_detokenize(output_seconds_);
    if (done() && prep_.req.stream) {
      if (prep_.req.include_usage) up.bytes += chunk(usage_json(), true);
      up.bytes += "data: [DONE]\n\n";
    }
  }
  return up;
}

std::pair<int, std::string> Job::final_response() const {
  for (const auto& c : choices_)
    if (c.finish_reason == "error") return {500, error_body(500, "Generation failed: " + c.error)};
  const bool chat = prep_.req.kind == ApiKind::Chat;
  OJson choices = OJson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    OJson ch = {{"index", i}};
    if (chat) {
      OJson msg = {{"role", "assistant"}};
      msg["content"] = (c.message.content.empty() && !c.message.tool_calls.empty()) ? OJson(nullptr)
                                                                                    : OJson(c.message.content);
      if (!c.message.reasoning.empty()) {
        msg["reasoning_content"] = c.message.reasoning;
        msg["reasoning"] = c.message.reasoning;
      }
      OJson calls = OJson::array();
      for (const auto& t : c.message.tool_calls)
        calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments_json}}}});
      msg["tool_calls"] = calls;
      ch["message"] = msg;
      ch["logprobs"] = prep_.req.logprobs ? chat_logprobs(c.logprobs) : OJson(nullptr);
    } else {
      ch["text"] = c.text;
      const size_t offset = prep_.req.echo ? prep_.prompt_texts[i].size() : 0;
      ch["logprobs"] = prep_.req.logprobs ? completion_logprobs(c.logprobs, offset) : OJson(nullptr);
    }
    ch["finish_reason"] = c.finish_reason;
    choices.push_back(std::move(ch));
  }
  OJson body = {{"id", prep_.id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", prep_.created},
                {"model", prep_.req.model},
                {"choices", choices},
                {"usage", usage_json()}};
  return {200, dump(body)};
}

std::pair<int, int> Job::token_usage() const {
  const OJson u = usage_json();
  return {u["prompt_tokens"].get<int>(), u["completion_tokens"].get<int>()};
}

std::vector<std::string> Job::unfinished_ids() const {
  std::vector<std::string> ids;
  for (size_t i = 0; i < choices_.size(); ++i)
    if (!choices_[i].done) ids.push_back(prep_.engine_requests[i].id);
  return ids;
}

}  // namespace m3::server
