// Loading without host fp32 (issue 9 item 5), on the GPU: the streamed safetensors loader (model/cuda_weight_loader.h)
// gives bit for bit the device weights of the host-fp32 path on the fixture checkpoints (fp32, MXFP8 and HF-layout
// bf16; bf16 and fp32 compute dtypes; tiny staging chunks so tensors straddle chunks), the dummy weights are
// deterministic and equal their CPU twin, a full-width M3 slice loads via dummy (seconds and GB printed), and the
// streaming bandwidth against the old path is measured and printed (not asserted).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "base/fp8_format.h"
#include "engine/request.h"
#include "engine/sampler.h"

#include "base/dtype.h"
#include "base/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/cuda_executor.h"
#include "model/weight_plan.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

#define SKIP_WITHOUT_GPU() \
  if (!CudaExecutor::available()) GTEST_SKIP() << "no CUDA device"

// The source tree: $M3_SOURCE_DIR when set (binaries carried to another machine), else the one this was built from.
std::string fixture(const char* name) {
  const char* env = std::getenv("M3_SOURCE_DIR");
  return (fs::path(env && *env ? env : M3_SOURCE_DIR) / "tests/golden/fixtures" / name).string();
}

double secs_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every slot's device bytes equal; returns the slots compared.
int expect_same_device_weights(const CudaExecutor& a, const CudaExecutor& b, const M3Config& c) {
  int n = 0;
  for (const WeightSlot& s : weight_plan(c)) {
    const std::vector<uint8_t> x = a.weight_bytes(s), y = b.weight_bytes(s);
    EXPECT_EQ(x.size(), y.size()) << s.label();
    if (x != y) {
      ADD_FAILURE() << s.label() << ": device bytes differ";
      if (++n > 1000) return n;  // keep the log short
    }
    ++n;
  }
  return n;
}

std::vector<float> logits_of(CudaExecutor& ex, int n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = (i * 37 + 11) % ex.config().vocab_size;
  std::vector<int32_t> pages;
  for (int p = 0; p < (n + ex.config().sparse_block_size - 1) / ex.config().sparse_block_size; ++p) pages.push_back(p);
  SeqInput in{std::span<const int32_t>(ids), 0, pages, false};
  return ex.forward(std::span<const SeqInput>(&in, 1))[0];
}

TEST(GpuLoad, StreamedSafetensorsEqualTheHostFp32PathBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"tiny_sparse_f32", "tiny_sparse_mxfp8", "tiny_hf_layout"}) {
    const std::string dir = fixture(name);
    const M3Config c = load_m3_config(dir + "/config.json");
    const M3Weights w = M3Weights::load(c, SafeTensors::open(dir));
    for (bool bf16 : {true, false})
      for (size_t chunk : {size_t(4096), size_t(32) << 20}) {
        SCOPED_TRACE(std::string(name) + (bf16 ? " bf16" : " fp32") + " chunk " + std::to_string(chunk));
        CudaExecutorOptions o;
        o.bf16_weights = bf16;
        CudaExecutor old(c, w, 16, o);
        StreamOptions so;
        so.chunk_bytes = chunk;
        auto streamed = CudaExecutor::load(c, dir, 16, o, so);
        const int slots = expect_same_device_weights(old, *streamed, c);
        const LoadStats& st = streamed->load_stats();
        EXPECT_GT(st.bytes_read, 0);
        std::printf("[gpu-load] %s %s chunk %zu: %d slots equal, %lld tensors, %.1f MB read in %.3f s\n", name,
                    bf16 ? "bf16" : "fp32", chunk, slots, (long long)st.tensors, st.bytes_read / 1e6, st.seconds);
        // Same weights ⇒ same logits, bit for bit (same kernels, same inputs).
        if (chunk == 4096) {
          EXPECT_EQ(logits_of(old, 40), logits_of(*streamed, 40));
        }
      }
  }
}

TEST(GpuLoad, StreamedLoadReportsMissingAndMisshapedTensorsClearly) {
  SKIP_WITHOUT_GPU();
  M3Config c = load_m3_config(fixture("tiny_sparse_f32") + "/config.json");
  c.hidden_size += 2;  // every matrix now has the wrong shape
  try {
    CudaExecutor::load(c, fixture("tiny_sparse_f32"), 4, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but the config implies"), std::string::npos) << e.what();
  }
}

TEST(GpuLoad, DummyWeightsAreDeterministicAndEqualTheirCpuTwin) {
  SKIP_WITHOUT_GPU();
  const M3Config c = load_m3_config(fixture("tiny_sparse_f32") + "/config.json");
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    CudaExecutorOptions o;
    o.bf16_weights = bf16;
    auto a = CudaExecutor::dummy(c, 5, 16, o), b = CudaExecutor::dummy(c, 5, 16, o), other = CudaExecutor::dummy(c, 6, 16, o);
    // The CPU twin through the host path: same bytes.
    CudaExecutor twin(c, dummy_weights(c, 5), 16, o);
    expect_same_device_weights(*a, *b, c);
    expect_same_device_weights(*a, twin, c);
    const WeightSlot embed = weight_plan(c)[0];  // a copy: the plan is a temporary
    EXPECT_NE(a->weight_bytes(embed), other->weight_bytes(embed));
    const std::vector<float> l = logits_of(*a, 40);
    for (float x : l) ASSERT_TRUE(std::isfinite(x));
    EXPECT_EQ(l, logits_of(*b, 40));
  }
}

// M3's real widths (docs/M3_MODEL.md §2.1): a 60-layer config cut to layers 0–2 dense + 2 MSA/MoE by truncate_layers,
// as `--load-format dummy --num-layers 5` does.
M3Config m3_slice(int layers) {
  M3Config c;
  c.hidden_size = 6144;
  c.num_layers = 60;
  c.num_q_heads = 64, c.num_kv_heads = 4, c.head_dim = 128;
  c.vocab_size = 200064;
  c.max_position_embeddings = 1048576;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 5e6, c.rotary_dim = 64;
  c.dense_intermediate_size = 12288;
  c.moe_intermediate_size = 3072, c.shared_intermediate_size = 3072;
  c.num_experts = 128, c.num_experts_per_tok = 4, c.routed_scaling_factor = 2.0f, c.use_routing_bias = true;
  c.index_num_heads = 4, c.index_head_dim = 128, c.sparse_block_size = 128, c.sparse_topk_blocks = 16;
  for (int l = 0; l < 60; ++l) {
    c.attn_kinds.push_back(l < 3 ? AttnKind::Dense : AttnKind::Sparse);
    c.mlp_kinds.push_back(l < 3 ? MlpKind::Dense : MlpKind::MoE);
  }
  c.validate();
  return truncate_layers(c, layers);
}

TEST(GpuLoad, FullWidthM3SliceLoadsViaDummy) {
  SKIP_WITHOUT_GPU();
  const M3Config c = m3_slice(5);
  const int64_t need = plan_bytes(weight_plan(c), 2);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  if (double(free_b) < double(need) + 4e9) GTEST_SKIP() << "needs " << need / 1e9 << " GB free";
  const auto t0 = Clock::now();
  auto ex = CudaExecutor::dummy(c, 1, 64, {});
  const double total_s = secs_since(t0);
  const LoadStats& st = ex->load_stats();
  EXPECT_EQ(st.bytes_written, need);
  std::printf("[gpu-load] full-width M3 slice (hidden 6144, 64/4 heads x 128, 128 experts top-4 x 3072, vocab 200064, "
              "layers 0-2 dense + 2 MSA/MoE) via dummy: %.2f GB of bf16 weights filled in %.3f s (%.0f GB/s); "
              "executor ready in %.3f s\n[gpu-load] %s\n",
              st.bytes_written / 1e9, st.seconds, st.bytes_written / 1e9 / st.seconds, total_s, ex->describe().c_str());
  // It runs: a 300-token prefill (dense layers + MSA past two blocks) gives finite logits.
  const auto t1 = Clock::now();
  const std::vector<float> l = logits_of(*ex, 300);
  std::printf("[gpu-load] slice prefill of 300 tokens: %.3f s (first call, includes workspace allocation)\n",
              secs_since(t1));
  ASSERT_EQ(l.size(), size_t(c.vocab_size));
  for (float x : l) ASSERT_TRUE(std::isfinite(x));
}

// A bf16 checkpoint at M3's hidden width (one dense layer, one MSA/MoE layer with 8 experts, vocab 32768: ~2.6 GB),
// written to a temporary directory, then loaded by the streaming loader (several ring shapes) and by the old path
// (host fp32 M3Weights, then the host-fp32 constructor). The page cache holds the file (just written), so this
// measures host → device streaming, not the disk.
TEST(GpuLoad, StreamingBandwidthAgainstTheHostFp32Path) {
  SKIP_WITHOUT_GPU();
  M3Config c = m3_slice(4);
  c.vocab_size = 32768;
  c.num_experts = 8;
  c.num_layers = 2;
  c.attn_kinds = {AttnKind::Dense, AttnKind::Sparse};
  c.mlp_kinds = {MlpKind::Dense, MlpKind::MoE};
  c.validate();
  const fs::path dir = fs::temp_directory_path() / "m3_gpu_load_bench";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    // config.json is not needed by the loaders under test (they take the config); the weights are a constant bf16
    // pattern (values do not matter for bandwidth).
    SafeTensorsWriter wr;
    for (const WeightSlot& s : weight_plan(c))
      for (const WeightPiece& p : s.pieces) {
        const bool mat = s.matrix;
        std::vector<uint8_t> bytes(size_t(p.numel()) * (mat ? 2 : 4), 0x3c);
        wr.add(p.names[0], mat ? DType::BF16 : DType::F32, p.shape, std::move(bytes));
      }
    const auto tw = Clock::now();
    wr.write((dir / "model.safetensors").string());
    std::printf("[gpu-load] bandwidth checkpoint: %.2f GB written in %.2f s\n",
                double(fs::file_size(dir / "model.safetensors")) / 1e9, secs_since(tw));
  }
  const double file_gb = double(fs::file_size(dir / "model.safetensors")) / 1e9;
  for (auto [chunk_mib, ring] : std::vector<std::pair<int, int>>{{32, 2}, {32, 2}, {8, 2}, {64, 2}, {32, 4}}) {
    StreamOptions so;
    so.chunk_bytes = size_t(chunk_mib) << 20;
    so.ring = ring;
    const auto t0 = Clock::now();
    auto ex = CudaExecutor::load(c, dir.string(), 4, {}, so);
    const double all = secs_since(t0);
    const LoadStats& st = ex->load_stats();
    std::printf("[gpu-load] streamed bf16->bf16 chunk %d MiB x %d: %.2f GB in %.3f s = %.2f GB/s (executor %.3f s)\n",
                chunk_mib, ring, st.bytes_read / 1e9, st.seconds, st.read_gb_per_s(), all);
  }
  {
    const auto t0 = Clock::now();
    const M3Weights w = M3Weights::load(c, SafeTensors::open(dir.string()));
    const double host_s = secs_since(t0);
    CudaExecutor old(c, w, 4, {});
    const double all = secs_since(t0);
    std::printf("[gpu-load] old path (host fp32 M3Weights, then upload): %.2f GB in %.3f s = %.2f GB/s (host read "
                "%.3f s, upload %.3f s)\n",
                file_gb, all, file_gb / all, host_s, all - host_s);
  }
  fs::remove_all(dir);
}

// Median ms of a greedy forward_sample step: B sequences decoding one token at position `pos` (decode graphs where
// eligible), or one prefill of `prefill` tokens when prefill > 0.
double step_ms(CudaExecutor& ex, int B, int pos, int prefill) {
  const int64_t Bk = ex.config().sparse_block_size;
  const int n = prefill > 0 ? prefill : 1, start = prefill > 0 ? 0 : pos;
  const int pages_per = int((start + n + Bk - 1) / Bk);
  GenerationParams greedy;
  greedy.sampling.temperature = 0.f;
  std::vector<std::vector<int32_t>> toks(static_cast<size_t>(B)), pts(static_cast<size_t>(B));
  std::vector<SeqInput> in;
  std::vector<RowSampling> rows;
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < n; ++i) toks[size_t(b)].push_back((b * 131 + i * 37 + 11) % ex.config().vocab_size);
    for (int p = 0; p < pages_per; ++p) pts[size_t(b)].push_back(b * pages_per + p);
    in.push_back(SeqInput{toks[size_t(b)], start, pts[size_t(b)], false});
    RowSampling r;
    r.params = &greedy, r.tokens = toks[size_t(b)], r.prompt_len = n;
    rows.push_back(r);
  }
  std::vector<double> t;
  for (int it = 0; it < (prefill > 0 ? 4 : 13); ++it) {
    const auto t0 = Clock::now();
    ex.forward_sample(in, rows);
    t.push_back(secs_since(t0) * 1e3);
  }
  t.erase(t.begin(), t.begin() + (prefill > 0 ? 1 : 3));  // warm-up (plans, graph capture)
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// `--load-format dummy --dtype fp8` at M3's real widths (issue 15 items 2 and 6): the FP8 slots are filled on the
// device, the slice runs (prefill through cuBLASLt FP8, decode through W8A16 inside the decode graphs), and the
// memory fit of the full model is computed from the executor's real allocations: slices of 3 (embeddings, LM head,
// the 3 dense layers) and 5 layers (+ 2 MSA/MoE layers) give the fixed part and one MoE layer; M3 = fixed + 57 MoE
// layers, per rank on 8 GPUs = / 8 (every weight sharded evenly, tensor or expert parallel).
TEST(GpuLoad, FullWidthM3SliceInFp8ViaDummyAndTheFullModelsMemoryFit) {
  SKIP_WITHOUT_GPU();
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  if (double(free_b) < 40e9) GTEST_SKIP() << "needs 40 GB free";
  int64_t bytes[2][2] = {};  // [fp8][slice 3, 5]
  double ms[2][4] = {};      // [fp8][decode B=1, decode B=32, prefill 2048 tokens, fill seconds]
  for (int fp8 = 0; fp8 < 2; ++fp8)
    for (int si = 0; si < 2; ++si) {
      const M3Config c = m3_slice(si == 0 ? 3 : 5);
      CudaExecutorOptions o;
      o.fp8_weights = fp8 == 1;
      auto ex = CudaExecutor::dummy(c, 1, 600, o);
      bytes[fp8][si] = ex->weight_device_bytes();
      EXPECT_EQ(ex->load_stats().bytes_written, bytes[fp8][si]);
      if (si == 0) continue;
      std::printf("[gpu-load] %s\n", ex->describe().c_str());
      ms[fp8][3] = ex->load_stats().seconds;
      if (fp8) {
        // 5 layers: q/k/v/o × 5, index × 2, dense MLP × 3 (gate_up, down), shared expert × 2 (gate_up, down),
        // routed experts × 2 (the gate_up and down stacks).
        EXPECT_EQ(ex->fp8_matrices(), 5 * 2 + 2 + 3 * 2 + 2 * 2 + 2 * 2);
        const std::vector<float> l = logits_of(*ex, 300);
        for (float x : l) ASSERT_TRUE(std::isfinite(x));
      }
      ms[fp8][0] = step_ms(*ex, 1, 1000, 0);
      ms[fp8][1] = step_ms(*ex, 32, 1000, 0);
      ms[fp8][2] = step_ms(*ex, 1, 0, 2048);
    }
  for (int fp8 = 0; fp8 < 2; ++fp8)
    std::printf("[gpu-load] M3 slice (3 dense + 2 MSA/MoE layers, full width) %s: %.2f GB of weights (filled in "
                "%.3f s); greedy step: decode B=1 %.3f ms, decode B=32 %.3f ms, prefill 2048 tokens %.2f ms\n",
                fp8 ? "--dtype fp8" : "bf16", bytes[fp8][1] / 1e9, ms[fp8][3], ms[fp8][0], ms[fp8][1], ms[fp8][2]);
  EXPECT_LT(bytes[1][1], bytes[0][1]);
  // The full model from the real allocations.
  const M3Config full = m3_slice(60);
  const int64_t moe_layers = full.num_layers - 3;
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    const int64_t fixed = bytes[fp8][0], moe = (bytes[fp8][1] - bytes[fp8][0]) / 2;
    const int64_t E = full.num_experts, I = full.moe_intermediate_size, H = full.hidden_size;
    const int64_t experts_bf16 = E * 3 * I * H * 2;  // stacked [E, 2I, H] + [E, H, I], bf16
    const int64_t experts_fp8 = E * (fp8_matrix_bytes(Fp8Scale::Blk128, 2 * I, H) + fp8_matrix_bytes(Fp8Scale::Blk128, H, I));
    const int64_t total = fixed + moe_layers * moe, rank = total / 8;
    std::printf("[gpu-load] memory fit, %s: fixed part %.2f GB, one MoE layer %.3f GB -> M3 (60 layers) %.1f GB, "
                "per rank on 8 GPUs %.1f GB, leaving %.1f GB of the %.1f GB H200 (KV + activations)%s\n",
                fp8 ? "--dtype fp8 (routed experts FP8)" : "bf16", fixed / 1e9, moe / 1e9, total / 1e9, rank / 1e9,
                (double(total_b) - double(rank)) / 1e9, double(total_b) / 1e9, fp8 ? "" : "");
    // The allocations include the FP8 routed experts now; the computed expert bytes of both storages, for the record.
    if (fp8)
      std::printf("[gpu-load] routed experts per MoE layer: %.3f GB FP8 (e4m3 + 128×128 scales) vs %.3f GB bf16; "
                  "bf16 experts would make M3 %.1f GB (%.1f GB per rank)\n",
                  experts_fp8 / 1e9, experts_bf16 / 1e9, (total + moe_layers * (experts_bf16 - experts_fp8)) / 1e9,
                  (total + moe_layers * (experts_bf16 - experts_fp8)) / 8 / 1e9);
  }
}

}  // namespace
}  // namespace m3
