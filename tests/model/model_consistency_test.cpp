// The reference engine must give identical logits however a sequence reaches it: one shot, in chunks of any
// size, token by token, or batched with other sequences. The CPU ops are deterministic per element, so these
// comparisons are exact.
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "kv/sequence_kv.h"
#include "test_model_util.h"

namespace m3 {
namespace {

class ModelConsistency : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new M3Model(test::tiny_config(), test::random_weights(test::tiny_config(), 7));
  }
  static void TearDownTestSuite() { delete model_; }
  static M3Model* model_;
};
M3Model* ModelConsistency::model_ = nullptr;

// 150 tokens with block 16 and top-4: positions ≥ 64 see more blocks than top-k, so selection drops blocks.
constexpr int64_t kLen = 150;

TEST_F(ModelConsistency, ChunkedPrefillEqualsOneShotForAnyChunkSize) {
  auto ids = test::random_ids(kLen, model_->config().vocab_size, 1);
  auto ref = test::run_chunked(*model_, ids, 0);
  for (int64_t chunk : {1, 7, 16, 33, 64, 149}) {
    auto got = test::run_chunked(*model_, ids, chunk);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i], ref[i]) << "chunk " << chunk << " element " << i;
  }
}

TEST_F(ModelConsistency, IncrementalDecodeEqualsFullForward) {
  const M3Config& c = model_->config();
  auto ids = test::random_ids(kLen, c.vocab_size, 2);
  auto full = test::run_chunked(*model_, ids, 0);
  // Prefill 90 tokens, then feed the rest one at a time, checking each step's last-row logits.
  KVCache cache(c, 16);
  SequenceKV seq(cache);
  seq.reserve(90);
  SeqInput pre{std::span<const int32_t>(ids.data(), 90), 0, seq.pages(), false};
  auto out = model_->forward(std::span<const SeqInput>(&pre, 1), cache);
  for (int64_t p = 90; p <= kLen; ++p) {
    const float* want = &full[size_t((p - 1) * c.vocab_size)];
    for (int64_t v = 0; v < c.vocab_size; ++v) ASSERT_EQ(out[0][v], want[v]) << "position " << p - 1;
    if (p == kLen) break;
    seq.reserve(p + 1);
    SeqInput step{std::span<const int32_t>(ids.data() + p, 1), p, seq.pages(), false};
    out = model_->forward(std::span<const SeqInput>(&step, 1), cache);
  }
}

TEST_F(ModelConsistency, BatchedSequencesEqualSeparateRuns) {
  const M3Config& c = model_->config();
  auto a = test::random_ids(kLen, c.vocab_size, 3);
  auto b = test::random_ids(41, c.vocab_size, 4);
  auto ref_a = test::run_chunked(*model_, a, 0);
  auto ref_b = test::run_chunked(*model_, b, 0);
  KVCache cache(c, 32);
  SequenceKV sa(cache), sb(cache);
  sa.reserve(kLen);
  sb.reserve(41);
  SeqInput in[2] = {{a, 0, sa.pages(), true}, {b, 0, sb.pages(), true}};
  auto out = model_->forward(in, cache);
  ASSERT_EQ(out[0], ref_a);
  ASSERT_EQ(out[1], ref_b);
}

// Below K·B tokens every MSA layer selects all visible blocks, so it must equal dense causal attention.
TEST_F(ModelConsistency, SparseLayersEqualDenseBelowTopkTimesBlock) {
  M3Config dense_cfg = test::tiny_config();
  for (auto& k : dense_cfg.attn_kinds) k = AttnKind::Dense;
  M3Model dense(dense_cfg, test::random_weights(test::tiny_config(), 7));
  const int64_t n = int64_t(dense_cfg.sparse_topk_blocks) * dense_cfg.sparse_block_size;  // 64
  auto ids = test::random_ids(n, dense_cfg.vocab_size, 5);
  EXPECT_EQ(test::run_chunked(*model_, ids, 0), test::run_chunked(dense, ids, 0));
  // …and past K·B the sparse model must differ from dense (selection really drops blocks).
  auto longer = test::random_ids(kLen, dense_cfg.vocab_size, 5);
  EXPECT_NE(test::run_chunked(*model_, longer, 0), test::run_chunked(dense, longer, 0));
}

TEST_F(ModelConsistency, SelectionFollowsTheMsaContract) {
  const M3Config& c = model_->config();
  auto ids = test::random_ids(kLen, c.vocab_size, 6);
  ForwardTrace trace;
  trace.capture_selection = true;
  test::run_chunked(*model_, ids, 0, &trace);
  const int K = c.sparse_topk_blocks, B = c.sparse_block_size;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.attn_kinds[l] != AttnKind::Sparse) {
      EXPECT_TRUE(trace.selection[l].empty());
      continue;
    }
    const auto& sel = trace.selection[l].at(0);
    for (int h = 0; h < c.index_num_heads; ++h)
      for (int64_t p = 0; p < kLen; ++p) {
        const int32_t* row = &sel[(size_t(h) * kLen + p) * K];
        const int local = int(p / B), n_valid = std::min(K, local + 1);
        for (int s = 0; s < K; ++s) {
          if (s < n_valid) {
            ASSERT_GE(row[s], 0);
            ASSERT_LE(row[s], local);
            if (s > 0 && s < n_valid - 1) {
              ASSERT_LT(row[s - 1], row[s]);  // unique (history kept ascending)
            }
          } else {
            ASSERT_EQ(row[s], -1);
          }
        }
        ASSERT_EQ(row[n_valid - 1], local) << "local block must be the last valid entry";
      }
  }
}

TEST_F(ModelConsistency, OutputsAreFiniteAndNotDegenerate) {
  const M3Config& c = model_->config();
  auto ids = test::random_ids(kLen, c.vocab_size, 8);
  auto lg = test::run_chunked(*model_, ids, 0);
  double sum_abs = 0;
  for (float x : lg) {
    ASSERT_TRUE(std::isfinite(x));
    sum_abs += std::fabs(x);
  }
  EXPECT_GT(sum_abs / double(lg.size()), 1e-3);
}

TEST_F(ModelConsistency, PageOutsideThePoolIsAnErrorNotAWildWrite) {
  KVCache cache(model_->config(), 2);
  std::vector<int32_t> ids = {1, 2, 3}, table = {5};
  SeqInput in{ids, 0, table, false};
  EXPECT_THROW(model_->forward(std::span<const SeqInput>(&in, 1), cache), Error);
}

TEST_F(ModelConsistency, TokenOutsideVocabularyIsAnError) {
  std::vector<int32_t> ids = {1, 2, model_->config().vocab_size};
  EXPECT_THROW(test::run_chunked(*model_, ids, 0), Error);
}

}  // namespace
}  // namespace m3
