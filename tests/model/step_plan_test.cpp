// StepRows (one flattening of a step for every executor), load_checkpoint and make_executor's KV sizing in the
// executor's own page size.
#include <gtest/gtest.h>

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/executor_factory.h"
#include "model/step_plan.h"

namespace m3 {
namespace {

const char* kFixture = "tests/golden/fixtures/tiny_sparse_f32";

M3Config small_config() {
  M3Config c;
  c.sparse_block_size = 4;
  c.vocab_size = 100;
  c.max_position_embeddings = 64;
  return c;
}

TEST(StepRows, FlattensPositionsSequencesSlotsCsrAndLogitRows) {
  const M3Config c = small_config();
  const std::vector<int32_t> a_tok{5, 6, 7}, a_pt{9, 3};  // positions 3..5: page 9 then page 3
  const std::vector<int32_t> b_tok{8}, b_pt{1};
  const SeqInput seqs[] = {{a_tok, 3, a_pt, false}, {b_tok, 0, b_pt, true}};
  const StepRows r = StepRows::build(c, seqs, 10);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(r.pos, (std::vector<int32_t>{3, 4, 5, 0}));
  EXPECT_EQ(r.row_seq, (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(r.slot, (std::vector<int32_t>{9, 3, 3, 1}));
  EXPECT_EQ(r.seq_begin, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(r.pt_indptr, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(r.pt_pages, (std::vector<int32_t>{9, 3, 1}));
  EXPECT_EQ(r.head_rows, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(r.max_new_tokens, 3);
}

TEST(StepRows, RejectsAStepThatIsNotCoveredByItsPageTable) {
  const M3Config c = small_config();
  const std::vector<int32_t> tok{1, 2}, pt{0};
  const SeqInput seqs[] = {{tok, 3, pt, false}};
  try {
    StepRows::build(c, seqs, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page table covers 4 tokens but 5 are needed"), std::string::npos);
  }
}

TEST(Checkpoint, LoadsConfigAndWeightsOnceAndShowsTheConfigBeforeTheWeights) {
  int seen = 0;
  Checkpoint ck = load_checkpoint(kFixture, [&](const M3Config& c) {
    EXPECT_GT(c.vocab_size, 0);
    ++seen;
  });
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(ck.weights.layers.size(), size_t(ck.config.num_layers));
  EXPECT_THROW(load_checkpoint("tests/no/such/model"), Error);
}

TEST(MakeExecutor, DividesTheKvBudgetByTheExecutorsOwnPageSize) {
  const M3Config c = load_checkpoint(kFixture).config;
  const int64_t page = CpuExecutor::page_bytes_for(c);
  auto ex = make_executor(kFixture, "cpu", KvBudget{page * 7 + page / 2, 0});
  EXPECT_EQ(ex->page_bytes(), page);
  EXPECT_EQ(ex->pool().capacity(), 7);
  auto by_tokens = make_executor(kFixture, "cpu", KvBudget{0, 3 * c.sparse_block_size + 1});
  EXPECT_EQ(by_tokens->pool().capacity(), 4);
  auto by_default = make_executor(kFixture, "cpu");
  EXPECT_EQ(by_default->pool().capacity(), default_cpu_pages(c));
}

TEST(MakeExecutor, RejectsABudgetBelowOnePageAndUnknownDevices) {
  EXPECT_THROW(make_executor(kFixture, "cpu", KvBudget{16, 0}), Error);
  EXPECT_THROW(make_executor(kFixture, "tpu"), Error);
}

}  // namespace
}  // namespace m3
