#include "model/device_sampling.h"

#include "base/error.h"
#include "base/rng.h"
#include "engine/request.h"

namespace m3 {

void enqueue_device_sampling(cuda::DeviceSampler& sampler, float* logits, int vocab, std::span<const RowSampling> rows,
                             std::span<const int32_t> logit_rows, cudaStream_t s) {
  stage_device_sampling(sampler, vocab, rows, logit_rows, s);
  sampler.launch(logits, s);
}

void stage_device_sampling(cuda::DeviceSampler& sampler, int vocab, std::span<const RowSampling> rows,
                           std::span<const int32_t> logit_rows, cudaStream_t s) {
  M3_CHECK(rows.size() == logit_rows.size(), "device sampling: {} rows for {} logit rows", rows.size(),
           logit_rows.size());
  sampler.begin(vocab);
  std::vector<int32_t> bias_ids, mask;
  std::vector<float> bias_vals;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowSampling& row = rows[i];
    cuda::SampleRowParams p;
    p.logit_row = logit_rows[i];
    if (!row.params) {
      sampler.add_row(p, nullptr, 0, 0, nullptr, nullptr, 0, nullptr, 0);
      continue;
    }
    const GenerationParams& g = *row.params;
    p.active = 1;
    p.temperature = g.sampling.temperature;
    p.top_p = g.sampling.top_p;
    p.top_k = g.sampling.top_k;
    p.min_p = g.sampling.min_p;
    p.top_logprobs = g.top_logprobs;
    const int generated = int(row.tokens.size()) - row.prompt_len;
    p.bits53 = uniform_bits_from_seed(row.seed, g.choice_index, uint64_t(generated));
    p.repetition = g.repetition_penalty;
    p.presence = g.presence_penalty;
    p.frequency = g.frequency_penalty;
    // Penalties read prompt + generated (repetition) or only the generated tokens (presence / frequency).
    const bool all = g.repetition_penalty != 1.f;
    const std::span<const int32_t> toks = all ? row.tokens : row.tokens.subspan(size_t(row.prompt_len));
    bias_ids.clear(), bias_vals.clear(), mask.clear();
    for (auto [t, b] : g.logit_bias) bias_ids.push_back(t), bias_vals.push_back(b);
    if (generated < g.min_tokens) {
      if (row.eos_token_id >= 0 && !g.ignore_eos) mask.push_back(row.eos_token_id);
      mask.insert(mask.end(), g.stop_token_ids.begin(), g.stop_token_ids.end());
    }
    sampler.add_row(p, toks.data(), int(toks.size()), all ? row.prompt_len : 0, bias_ids.data(), bias_vals.data(),
                    int(bias_ids.size()), mask.data(), int(mask.size()), row.allowed);
  }
  sampler.upload(s);
}

std::vector<SampledToken> finish_device_sampling(cuda::DeviceSampler& sampler, std::span<const RowSampling> rows,
                                                 cudaStream_t s) {
  sampler.finish(s);
  std::vector<SampledToken> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].params) continue;
    out[i].id = sampler.ids()[i];
    if (rows[i].params->top_logprobs >= 0) {
      const cuda::SampleLogprobs& lp = sampler.logprobs(int(i));
      TokenLogprob t;
      t.id = out[i].id;
      t.logprob = lp.chosen;
      for (int j = 0; j < lp.n_top; ++j) t.top.emplace_back(lp.top_ids[j], lp.top_logprobs[j]);
      out[i].logprob = std::move(t);
    }
  }
  return out;
}

}  // namespace m3
