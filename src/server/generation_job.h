// What the HTTP layer needs from one generation request in flight, whatever API it came through: the OpenAI
// chat/completions Job (openai_service.h) and the Anthropic Messages job (anthropic_job.h) both implement it, so
// the connection code (http_session.cpp) submits, streams, aborts and answers them the same way.
// Not thread-safe: the HTTP layer calls it from the connection's strand.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/request.h"

namespace m3::server {

class GenerationJob {
 public:
  virtual ~GenerationJob() = default;

  virtual const std::string& id() const = 0;                           // "chatcmpl-…", "msg_…"
  virtual const std::vector<EngineRequest>& engine_requests() const = 0;  // one per choice
  int num_choices() const { return int(engine_requests().size()); }
  virtual bool streaming() const = 0;
  virtual bool done() const = 0;

  // Streaming: the bytes to send before any output (OpenAI: the assistant role chunks; Anthropic: message_start).
  virtual std::string stream_prologue() = 0;

  struct Update {
    std::string bytes;                   // SSE events to send now (streaming only)
    std::vector<std::string> abort_ids;  // engine requests to abort (stop string matched)
  };
  // Feeds one engine event of choice `i`. When the last choice finishes, a streaming update also carries the
  // stream's closing events.
  virtual Update on_output(int i, const EngineOutput& out) = 0;

  // Non-streaming, after done(): HTTP status and body.
  virtual std::pair<int, std::string> final_response() const = 0;

  // Engine ids of choices that have not finished (to abort on disconnect).
  virtual std::vector<std::string> unfinished_ids() const = 0;

  // {prompt_tokens, completion_tokens} so far (for the access log).
  virtual std::pair<int, int> token_usage() const = 0;
};

}  // namespace m3::server
