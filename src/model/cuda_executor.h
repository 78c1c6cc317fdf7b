// The CUDA executor (issue 5): the M3 forward of M3Model::forward on one GPU, over a device-resident paged cache.
// One page id addresses every layer's pools (docs/KV_CACHE.md), but each layer owns its own K, V [P, Hkv, B, D] and
// index-K [P, B, Di] slabs (issue 9), so the attention kernels view them as virtual pages v = p·Hkv + h.
// Weights and the cache are BF16 on the device by default (cuBLASLt BF16 GEMMs, FP32 accumulate); `bf16_weights =
// false` keeps FP32 weights, exact FP32 GEMMs and an FP32 cache, which the whole-model test compares with the CPU
// reference at tight tolerance.
// Built only with -DM3_WITH_CUDA=ON (targets linking m3_cuda_executor see the definition M3_WITH_CUDA=1); CUDA types
// stay behind the pimpl so C++ callers need no CUDA headers.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/executor.h"
#include "model/cuda_weight_loader.h"
#include "model/m3_weights.h"
#include "model/weight_plan.h"

namespace m3 {

// Attention kernels of the MSA layers. Msa: the tensor-core kernels where the shapes are theirs (bf16 cache, head
// dim 128, block 128; docs/KERNELS.md §8–9), else v1. MsaV1: the query-major v1 kernels (fp32 math over the cache).
// Dense: MSA layers run dense causal attention and skip the index branch (a benchmark baseline, not the model).
enum class AttentionBackend { Msa, MsaV1, Dense };

struct CudaExecutorOptions {
  bool bf16_weights = true;
  // `--dtype fp8` (issue 15, docs/FP8.md §6): the MXFP8 matrices of attention q/k/v/o, index q/k, the dense MLP and
  // the shared expert stay FP8 on the device (e4m3 + 128×128 power-of-two scales, converted once at load); the rest
  // as with bf16_weights (routed experts, embeddings, LM head bf16; norms, router fp32; bf16 KV cache). Needs
  // bf16_weights and weights from `load` (MXFP8 slots) or `dummy` (every such slot FP8).
  bool fp8_weights = false;
  // FP8 projections of fewer rows than this run W8A16 (bf16 activations, weights dequantised in registers), from
  // here on cuBLASLt FP8×FP8 (activations quantised to e4m3 per 1×128: faster, less accurate — docs/FP8.md §3);
  // ≤ 0: always W8A16 (base/fp8_format.h fp8_pick_path).
  int fp8_lt_min_rows = 16;
  AttentionBackend attention = AttentionBackend::Msa;
  bool validate = false;  // check every sparse layer's selection against the MSA contract (syncs; tests)
  int device = 0;
  // Decode steps through CUDA graphs (docs/ENGINE_STEP.md): pure decode steps of up to max_graph_batch sequences
  // are padded to a bucket and replayed from a captured graph. `--enforce-eager` turns it off (as in vLLM).
  bool cuda_graphs = true;
  int max_graph_batch = 256;
  // false: decode steps still run in graph form (padded bucket, device plans) but are never captured — the eager
  // twin the graph tests compare replays with bit for bit.
  bool capture_graphs = true;
  // `--kv-cache-dtype fp8` (issue 15 item 4, docs/FP8.md §8.2): K, V and index-K pools of e4m3 codes with per-tensor
  // fp32 scales (value = e4m3 · scale). The decode kernels read e4m3 (PagedDecodeTc / MsaDecodeIndex e4m3
  // instantiations, graphs included); prefill dequantises the step's pages of one layer into a bf16 staging pool
  // (one layer's K/V/index-K pages: ≈ 1/num_layers of a bf16 cache) and runs the bf16 kernels there. Needs
  // bf16_weights, the tensor-core shapes (head dim 128, 128-token pages, G = 16; index dim 128, ≤ 4 index heads,
  // top-k ≤ 16) and attention msa or dense; anything else is refused at construction.
  bool fp8_kv = false;
  // The scales every layer starts with (kept per layer in the executor, so a calibration can set them later); 1.0
  // as vLLM without calibration. Must be finite and > 0.
  float kv_k_scale = 1.f, kv_v_scale = 1.f, kv_index_scale = 1.f;
};

// What the decode graphs did so far (tests, the startup log).
struct GraphStats {
  int64_t replays = 0;           // decode steps replayed from a graph
  int64_t captures = 0;          // graphs captured (first use of a bucket, and after invalidations)
  int64_t eager_graph_form = 0;  // decode steps run eagerly in graph form (the step before a capture)
  int64_t eager_steps = 0;       // steps that are no graph decode step (prefill, mixed, logprobs, too large)
  int64_t invalidations = 0;     // times every graph was dropped because a device buffer moved
  int64_t capture_failures = 0;  // captures that failed (that bucket then stays eager; logged)
};

class CudaExecutor final : public ModelExecutor {
 public:
  // num_pages ≤ 0: as many KV pages as fit in 90 % of the free device memory (minus 1 GiB) after the weights.
  CudaExecutor(const M3Config& cfg, const M3Weights& weights, int32_t num_pages, CudaExecutorOptions opt = {});
  // Loads config.json + safetensors of a model directory (MXFP8 dequantised at load, then stored as opt says).
  static std::unique_ptr<CudaExecutor> load(const std::string& model_dir, int32_t num_pages,
                                            CudaExecutorOptions opt = {});
  // The weights of `cfg` (possibly io/config.h truncate_layers'd) streamed from the safetensors in `model_dir` to
  // the device and converted there (model/cuda_weight_loader.h): no host fp32 copy. Bit for bit the device weights
  // the host-M3Weights constructor gives for the same checkpoint.
  static std::unique_ptr<CudaExecutor> load(const M3Config& cfg, const std::string& model_dir, int32_t num_pages,
                                            CudaExecutorOptions opt, StreamOptions stream = {});
  // Random weights of cfg's shapes made on the device (`--load-format dummy`), deterministic for a seed; the CPU
  // twin is model/weight_plan.h dummy_weights.
  static std::unique_ptr<CudaExecutor> dummy(const M3Config& cfg, uint64_t seed, int32_t num_pages,
                                             CudaExecutorOptions opt = {});
  // How the weights were loaded (zero for the host-M3Weights constructor).
  const LoadStats& load_stats() const;
  // One weight slot's device bytes (bf16 or fp32 as stored; FP8: the e4m3 values then the scales), for tests.
  std::vector<uint8_t> weight_bytes(const WeightSlot& s) const;
  // Device bytes of the model's weights as allocated (FP8 values + scales, bf16 / fp32 matrices and vectors).
  int64_t weight_device_bytes() const;
  // How many weight matrices are stored as FP8.
  int fp8_matrices() const;
  ~CudaExecutor() override;

  // True when at least one CUDA device is usable (never throws).
  static bool available();

  const M3Config& config() const override;
  PagePool& pool() override;
  // Same contract as M3Model::forward. Trace: capture_hidden and capture_selection are supported
  // (selection per sequence [Hidx, n, top_k], history ids in ascending order, local last — as the CPU's).
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace = nullptr) override;
  // The serving step: the forward, then penalties / bias / min_tokens, the choice and the logprobs on the device
  // (backend/cuda/sampling.cuh); only the ids (+ logprobs when asked) come back, in the step's one sync.
  std::vector<SampledToken> forward_sample(std::span<const SeqInput> seqs, std::span<const RowSampling> rows,
                                           const std::function<void()>& before_sampling = {}) override;
  std::string describe() const override;
  GraphStats graph_stats() const;
  // Device bytes one page costs (page_bytes_for of this executor's options).
  int64_t page_bytes() const override;
  // Device bytes one page costs: K and V of every layer and index-K of the sparse layers in the cache's element type
  // (bf16 with bf16 weights, fp32 with fp32 weights, e4m3 with fp8_kv), plus with fp8_kv the page's share of the
  // bf16 prefill staging pool (K, V and index-K of ONE layer in bf16).
  static int64_t page_bytes_for(const M3Config& c, const CudaExecutorOptions& o);

 private:
  struct Impl;
  explicit CudaExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3
