// One request choice inside the engine: its tokens (prompt, then generated), its pages and how far the cache has
// computed them. The scheduler owns every Sequence and changes the scheduling fields; the engine reads them and
// keeps its own per-request state (sink, timings, resolved seed) in the last block.
#pragma once

#include <chrono>
#include <memory>
#include <cstdint>
#include <vector>

#include "engine/request.h"
#include "grammar/constraint.h"

namespace m3 {

struct Sequence {
  using Clock = std::chrono::steady_clock;

  // ---- scheduling state (engine/scheduler.cpp) ----
  EngineRequest req;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int prompt_len = 0;
  int generated = 0;
  std::vector<int32_t> pages;   // logical block → physical page; one pool reference each
  int64_t computed = 0;         // tokens whose K/V/index-K are in the pages
  int registered = 0;           // leading pages already offered to the prefix cache
  int cached_tokens = -1;       // prefix-cache hit at first admission (−1: not admitted yet)
  uint64_t arrival = 0;         // submission order, the FCFS tie-break
  FinishReason finish = FinishReason::None;
  // Waits for something outside the scheduler (media features being encoded): skipped by admission and not counted
  // as work while set. The scheduler sets it when its admission check refuses; the engine clears it.
  bool held = false;

  // ---- engine state (engine/engine.cpp; the scheduler never reads it) ----
  OutputSink sink;
  uint64_t seed = 0;  // the request's seed, or a random one drawn at submission
  Clock::time_point t_arrival, t_last;
  bool first_token_sent = false;
  std::unique_ptr<grammar::Constraint> constraint;  // from req.constraint; advanced with every sampled token
  // With req.media_encoder: the features of items [media_first, items) concatenated (media_first = items: none yet).
  std::shared_ptr<const std::vector<float>> media_features;
  size_t media_first = 0;

  Sequence(EngineRequest r, uint64_t order) : req(std::move(r)), arrival(order), t_arrival(Clock::now()) {
    tokens = req.prompt;
    prompt_len = int(tokens.size());
    if (req.media_encoder) media_first = req.media_encoder->item_slots.size();
  }
  int64_t pending() const { return int64_t(tokens.size()) - computed; }
};

}  // namespace m3
