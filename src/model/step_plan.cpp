#include "model/step_plan.h"

#include <algorithm>

#include "base/error.h"

namespace m3 {

void validate_step(const M3Config& c, std::span<const SeqInput> seqs, int32_t num_pages) {
  const int64_t B = c.sparse_block_size;
  for (const auto& s : seqs) {
    M3_CHECK(!s.tokens.empty(), "forward: a sequence brings no new tokens");
    const int64_t end = s.start_pos + int64_t(s.tokens.size());
    M3_CHECK(int64_t(s.page_table.size()) * B >= end, "forward: page table covers {} tokens but {} are needed",
             s.page_table.size() * B, end);
    M3_CHECK(c.max_position_embeddings <= 0 || end <= c.max_position_embeddings,
             "forward: position {} exceeds max_position_embeddings {}", end - 1, c.max_position_embeddings);
    for (int32_t p : s.page_table)
      M3_CHECK(p >= 0 && p < num_pages, "forward: page {} outside the pool of {}", p, num_pages);
    for (int32_t id : s.tokens)
      M3_CHECK(id >= 0 && id < c.vocab_size, "forward: token id {} is outside the vocabulary [0, {})", id,
               c.vocab_size);
  }
}

StepRows StepRows::build(const M3Config& c, std::span<const SeqInput> seqs, int32_t num_pages) {
  validate_step(c, seqs, num_pages);
  const int64_t B = c.sparse_block_size;
  StepRows r;
  r.pt_indptr.push_back(0);
  for (size_t si = 0; si < seqs.size(); ++si) {
    const SeqInput& sq = seqs[si];
    r.seq_begin.push_back(r.num_rows());
    for (size_t i = 0; i < sq.tokens.size(); ++i) {
      const int32_t p = int32_t(sq.start_pos + int64_t(i));
      r.ids.push_back(sq.tokens[i]);
      r.pos.push_back(p);
      r.row_seq.push_back(int32_t(si));
      r.slot.push_back(sq.page_table[size_t(p / B)]);
    }
    r.pt_pages.insert(r.pt_pages.end(), sq.page_table.begin(), sq.page_table.end());
    r.pt_indptr.push_back(int32_t(r.pt_pages.size()));
    r.max_new_tokens = std::max(r.max_new_tokens, int(sq.tokens.size()));
    const int64_t first = sq.all_logits ? r.seq_begin.back() : r.num_rows() - 1;
    for (int64_t t = first; t < r.num_rows(); ++t) r.head_rows.push_back(int32_t(t));
  }
  r.seq_begin.push_back(r.num_rows());
  return r;
}

}  // namespace m3
