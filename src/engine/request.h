// What crosses the boundary between the HTTP side and the engine thread. Plain, serialisable data: token ids,
// sampling parameters, limits — so a gateway process can later send the same thing over the wire.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "kv/prefix_cache.h"

namespace m3 {

namespace grammar {
struct ConstraintSpec;
}

struct GenerationParams {
  SamplingParams sampling;           // temperature, top_p, top_k, min_p, seed
  int max_tokens = 16;               // new tokens at most (≥ 1)
  int min_tokens = 0;                // EOS / stop ids are suppressed before this many tokens
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  float presence_penalty = 0.f;      // [-2, 2], OpenAI semantics (on generated tokens)
  float frequency_penalty = 0.f;     // [-2, 2]
  float repetition_penalty = 1.f;    // (0, 2], HF/vLLM semantics (on prompt + generated tokens)
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to logits before sampling
  // −1: no logprobs; 0..20: logprob of the chosen token + that many top ones, from the raw logits (before
  // penalties, bias and temperature, like vLLM's default)
  int top_logprobs = -1;
  uint64_t choice_index = 0;         // for n > 1: keys the RNG stream with the seed

  // Throws m3::Error naming the field when out of range (vocab_size bounds token ids).
  void validate(int vocab_size) const;
};

// Vision features made on demand (issue 12; docs/MEDIA.md "Through the engine"): instead of every item's features
// up front (EngineRequest::media_embeds), the engine asks for those of the items it will prefill — from the first
// item whose slot tokens are not all inside the prompt's cached prefix — so an image whose placeholder span the
// prefix cache already holds is never encoded. Shared by the choices of a request.
struct MediaEncoder {
  // The prompt's images / videos in order: slot tokens per item (Σ = the prompt's slot tokens; a video's groups
  // are one item).
  std::vector<int64_t> item_slots;
  // Called with the items' features concatenated in order ([Σ slots, hidden_size] floats), or with an error
  // message (the request then fails with it).
  using Done = std::function<void(std::shared_ptr<const std::vector<float>> features, std::string error)>;
  // Makes the features of items [first, end) off the engine thread (it must not block) and calls done exactly
  // once, from any thread — also from inside this call.
  std::function<void(size_t first, size_t end, Done done)> encode;
};

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;
  GenerationParams params;
  int priority = 0;  // lower runs first (vLLM semantics); FCFS within a priority
  // Constrained decoding (grammar/constraint.h): every sampled token of the constrained region is one the grammar
  // allows, and EOS only where the document may end. Shared by the choices of a request. nullptr: unconstrained.
  std::shared_ptr<const grammar::ConstraintSpec> constraint;
  // Images / videos in the prompt: their placeholder spans and content hashes, folded into the prefix-cache keys
  // of the pages they cover (kv/prefix_cache.h). Empty for text.
  std::vector<MediaSpan> media;
  // Vision features of the prompt's image / video slot tokens (ids == image_token_id / video_token_id), in order,
  // [slots, hidden_size] (model/vision_model.h). Each prefill chunk passes its share to the executor
  // (SeqInput::media_embeds), which replaces those rows' embeddings. Null for text.
  std::shared_ptr<const std::vector<float>> media_embeds;
  // Or (not both): the features on demand, for the items the prefix cache does not already cover (above).
  std::shared_ptr<const MediaEncoder> media_encoder;
};

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// One engine → client event. Tokens arrive in order; the last event has finish != None.
struct EngineOutput {
  std::vector<int32_t> tokens;         // new tokens since the previous event
  std::vector<TokenLogprob> logprobs;  // parallel to tokens when requested
  FinishReason finish = FinishReason::None;
  std::string error;                   // when finish == Error
  int prompt_tokens = 0;
  int cached_tokens = 0;               // prompt tokens served from the prefix cache
  int completion_tokens = 0;           // so far
};

// Called on the engine thread: keep it cheap (push into a queue / post to an io_context).
using OutputSink = std::function<void(const EngineOutput&)>;

}  // namespace m3
