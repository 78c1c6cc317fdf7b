// The OpenAI-compatible API without the sockets: request → engine requests, engine outputs → response bytes.
// The HTTP layer (http_server.h) owns connections and calls into this; unit tests drive it directly.
//
//   prepare()  body → validated request, prompt ids (chat template + tokenizer), one EngineRequest per choice
//   Job        per HTTP request: feeds each choice's EngineOutput through a ChoiceStream and renders SSE chunks
//              (streaming) or the final JSON body, plus usage.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "server/backend.h"
#include "server/chat_prompt.h"
#include "server/choice_stream.h"
#include "server/generation_job.h"
#include "server/request_parse.h"
#include "server/request_timings.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace m3::server {

// What the media hook returns: the prompt with every anchor expanded, and — when the server runs the vision tower —
// per item (prompt order) its content hash and slot-token count, and either the features of all slots
// [slots, hidden] (embeds) or the encoder the engine asks for the items the prefix cache does not hold (encode;
// EngineRequest::media_encoder). A hook that only validates returns the prompt alone (std::string converts).
struct MediaPrepared {
  MediaPrepared() = default;
  MediaPrepared(std::string p) : prompt(std::move(p)) {}  // NOLINT: implicit on purpose
  std::string prompt;
  std::vector<uint64_t> hashes;
  std::vector<int64_t> slots;
  std::shared_ptr<const std::vector<float>> embeds;
  // What an encode call gives back: items [first, end)'s features concatenated (or an error message), the
  // encoder's wall time and the items it ran on (the others' features were cached).
  struct Encoded {
    std::shared_ptr<const std::vector<float>> features;
    std::string error;
    double seconds = 0;
    int64_t items_encoded = 0;
  };
  // Makes items [first, end) off the calling thread (the engine's) and calls done once, from any thread.
  std::function<void(size_t first, size_t end, std::function<void(Encoded)> done)> encode;
  // Wall time of the two halves of the hook, for /metrics: the media gateway (fetch, decode, resize, patchify,
  // templating; on its own pool) and, for embeds, the vision encoder. 0 where the hook does not say.
  double gateway_seconds = 0, encode_seconds = 0;
  int64_t items_encoded = 0;  // embeds: items the vision encoder ran on (the others' features were cached)
  // The gateway's stages (request_stage_seconds media_*; media::GatewayTimings): collect on the request thread,
  // queue / load / hash / process summed over the items, expand after the last one. Observed with gateway_seconds.
  struct Stages {
    double collect = 0, queue = 0, load = 0, hash = 0, process = 0, process_user = 0, process_sys = 0, expand = 0;
  } stages;
};

struct ServiceConfig {
  ApiLimits limits;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat_template;  // null: /v1/chat/completions answers 400
  // How content part arrays reach the template; nullopt: detect_content_format(*chat_template).
  std::optional<ContentFormat> content_format;
  int64_t created = 0;                                // /v1/models "created"
  // Rendered chat prompts go through Tokenizer::encode_cached (resumes at the longest shared prefix of an
  // earlier prompt, id-exact); false: plain encode (`serve --no-tokenizer-prefix-cache`).
  bool tokenizer_prefix_cache = true;
  // Constrained decoding: the model's EOS id (allowed where a document may end; −1: none). The mask width is
  // limits.vocab_size (0: the tokenizer's vocabulary size).
  int32_t eos_token_id = -1;
  // The media gateway (src/media, issue 12): given the validated messages and the rendered prompt (one bare
  // anchor per image / video), fetches, decodes and preprocesses every item and returns the expanded prompt; an
  // m3::Error it throws is the client's fault (bad, oversized, forbidden or unreachable media) and becomes a 400
  // "invalid_media" carrying its message. Empty: chat requests with media get a 400 (not served). Set by
  // `m3serve serve` where the media libraries are built.
  std::function<MediaPrepared(const OJson& messages, std::string prompt)> prepare_media;
  // Slot token ids of the model (config.json image_token_index / video_token_index): with serve_media and
  // embeddings (or an encoder) from the hook, the runs of these ids in the tokenised prompt become
  // EngineRequest::media spans and receive MediaPrepared::embeds (or an EngineRequest::media_encoder over encode
  // that records each call in /metrics).
  int32_t image_token_id = -1, video_token_id = -1;
  // True once a backend runs the vision tower; until then media that prepare cleanly still get a 400
  // "unsupported_parameter" (after validation, so a broken file is reported as such).
  bool serve_media = false;
};

struct PreparedJob {
  ParsedRequest req;
  std::vector<EngineRequest> engine_requests;  // one per choice, choice i ↔ engine_requests[i]
  std::vector<ChoiceOptions> choice_options;
  std::vector<std::string> prompt_texts;       // completions echo: prompt text per choice
  std::string id;                              // "chatcmpl-…" / "cmpl-…"
  int64_t created = 0;
};

class OpenAIService {
 public:
  explicit OpenAIService(ServiceConfig cfg);

  const ServiceConfig& config() const { return cfg_; }

  // Parses, validates, templates and tokenises. Throws ApiError.
  PreparedJob prepare(ApiKind kind, std::string_view body) const;
  // True when prepare() may block on media (a chat body that mentions image / video while a media gateway is
  // configured): the HTTP layer then runs it off the io thread. A cheap substring test; false positives only cost
  // a thread hop.
  bool prepare_may_block(ApiKind kind, std::string_view body) const;

  // Simple endpoints: JSON bodies. Throw ApiError.
  std::string models_body() const;
  std::string tokenize_body(std::string_view body) const;
  std::string detokenize_body(std::string_view body) const;

  // Renders the chat template for a validated chat request (exposed for tests). Requests with image / video
  // parts are refused with a 400 (no media pipeline yet) unless allow_media; the prompt then has their anchors.
  std::string render_chat(const ParsedRequest& r, bool allow_media = false) const;
  // Attaches MediaPrepared to engine requests: slot-token runs of `ids` → spans with each item's hash (exposed for
  // tests). Throws ApiError 500 when the runs do not add up to the items' slot counts.
  std::vector<MediaSpan> media_spans(std::span<const int32_t> ids, const MediaPrepared& m) const;
  // Ids of a rendered chat prompt (no BOS: the template wrote it), through the tokenizer's prefix cache.
  std::vector<int32_t> encode_chat_prompt(std::string_view text) const;

  // Preprocess / detokenise time per request (for /metrics).
  RequestTimings& timings() const { return *timings_; }

 private:
  PreparedJob prepare_impl(ApiKind kind, std::string_view body) const;
  // The request's grammar bound to the vocabulary; compiled grammars (with their mask caches) are shared by every
  // request with the same grammar_key, up to kGrammarCacheSize of them.
  std::shared_ptr<grammar::CompiledGrammar> compiled_grammar(const ParsedRequest& r) const;
  std::string render_chat_impl(const ParsedRequest& r, bool allow_media, MediaPrepared* media) const;

  ServiceConfig cfg_;
  static constexpr size_t kGrammarCacheSize = 64;
  mutable std::once_flag vocab_once_;
  mutable std::shared_ptr<const grammar::TokenVocab> vocab_;
  mutable std::mutex grammar_mu_;
  mutable std::map<std::string, std::shared_ptr<grammar::CompiledGrammar>> grammars_;
  // Shared with the media encoders of requests in the engine, which may report after the service is gone.
  std::shared_ptr<RequestTimings> timings_ = std::make_shared<RequestTimings>();
  mutable std::atomic<uint64_t> next_id_{1};
};

// One HTTP generation request in flight (OpenAI chat / completions). Not thread-safe: the HTTP layer calls it
// from one strand.
class Job : public GenerationJob {
 public:
  Job(const OpenAIService& svc, PreparedJob prep);

  const std::string& id() const override { return prep_.id; }
  const std::vector<EngineRequest>& engine_requests() const override { return prep_.engine_requests; }
  bool streaming() const override { return prep_.req.stream; }
  bool done() const override { return finished_ == int(choices_.size()); }
  const PreparedJob& prepared() const { return prep_; }

  // Streaming: the assistant role chunks for chat.
  std::string stream_prologue() override;
  // When the last choice finishes, a streaming update also carries the usage chunk (if asked) and "data: [DONE]".
  Update on_output(int i, const EngineOutput& out) override;
  std::pair<int, std::string> final_response() const override;
  std::vector<std::string> unfinished_ids() const override;
  // {prompt_tokens, completion_tokens} as in the usage block, so far.
  std::pair<int, int> token_usage() const override;

 private:
  struct Choice {
    std::unique_ptr<ChoiceStream> stream;
    ParsedMessage message;                 // chat, accumulated (non-streaming)
    std::string text;                      // completions, accumulated
    std::vector<TokenLogprob> logprobs;    // accumulated (non-streaming)
    std::string finish_reason;
    std::string error;
    bool done = false;
  };
  std::string chunk(const nlohmann::ordered_json& choices_or_usage, bool usage) const;
  nlohmann::ordered_json usage_json() const;
  nlohmann::ordered_json chat_logprobs(const std::vector<TokenLogprob>& lps) const;
  nlohmann::ordered_json completion_logprobs(const std::vector<TokenLogprob>& lps, size_t text_offset) const;
  std::string token_text(int32_t id) const;

  const OpenAIService& svc_;
  PreparedJob prep_;
  std::vector<Choice> choices_;
  int finished_ = 0;
  double output_seconds_ = 0;  // time in ChoiceStream::on_output, all choices (→ request_detokenize_seconds)
};

}  // namespace m3::server
