// What a forward step brings, and its rows flattened once for every executor (CPU reference and CUDA).
// A step is a ragged batch of sequences, each bringing n new tokens on top of start_pos cached ones; row t of the
// step is one new token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "io/config.h"

namespace m3 {

struct SeqInput {
  SeqInput() = default;
  // Brace initialisation as before ({tokens, start_pos, page_table, all_logits}); media_embeds is optional.
  SeqInput(std::span<const int32_t> tokens_, int64_t start_pos_, std::span<const int32_t> page_table_,
           bool all_logits_ = false, std::span<const float> media_embeds_ = {})
      : tokens(tokens_), start_pos(start_pos_), page_table(page_table_), all_logits(all_logits_),
        media_embeds(media_embeds_) {}

  std::span<const int32_t> tokens;      // [n] new tokens of this step
  int64_t start_pos = 0;                // tokens of this sequence already in the cache (positions start here)
  std::span<const int32_t> page_table;  // logical block → physical page; covers start_pos + n tokens
  bool all_logits = false;              // logits for every new token, else only for the last one
  // Vision features for this step's image / video slot tokens (ids == image_token_id / video_token_id), in order,
  // [slots, hidden_size]: they replace those rows' embeddings before layer 0. Empty: plain embeddings (text).
  std::span<const float> media_embeds;
};

// Checks a step before any backend touches memory: every sequence brings tokens, token ids are inside the
// vocabulary, positions stay within max_position_embeddings, and the page table covers the new positions with
// page ids inside a pool of `num_pages`. Throws m3::Error naming what is wrong.
void validate_step(const M3Config& cfg, std::span<const SeqInput> seqs, int32_t num_pages);

// The rows of a validated step. T = total new tokens, S = sequences.
struct StepRows {
  std::vector<int32_t> ids;        // [T] token id of each row
  std::vector<int32_t> pos;        // [T] absolute position of each row
  std::vector<int32_t> row_seq;    // [T] sequence of each row
  std::vector<int32_t> slot;       // [T] physical page that holds the row's K/V/index-K (page_table[pos / B])
  std::vector<int64_t> seq_begin;  // [S + 1] first row of each sequence, then T
  std::vector<int32_t> pt_indptr;  // [S + 1] page-table CSR: sequence s owns pt_pages[pt_indptr[s], pt_indptr[s+1])
  std::vector<int32_t> pt_pages;   // concatenated page tables
  std::vector<int32_t> head_rows;  // rows whose logits are returned: every row (all_logits) or the last of each
  int max_new_tokens = 0;          // most new tokens any sequence brings

  int64_t num_rows() const { return int64_t(pos.size()); }
  // Validates (validate_step) and flattens.
  static StepRows build(const M3Config& cfg, std::span<const SeqInput> seqs, int32_t num_pages);
};

}  // namespace m3
