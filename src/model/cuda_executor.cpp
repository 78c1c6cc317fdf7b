// CudaExecutor: mirrors M3Model::forward (model/m3_model.cpp) op for op on the GPU.
//   per step (plan):  rows (positions, sequence ids, cache slots, page-table CSR) uploaded once; dense page lists,
//                     MSA page-list offsets and indexer tiles planned once and shared by all layers.
//   per layer (run):  norm → QKV GEMM → fused q/k norm + RoPE + cache write → [index GEMM → fused index norm + RoPE +
//                     index-K write → block scores → top-k → sparse attention] or dense attention → O GEMM (+= x)
//                     → norm → MLP or MoE (+= x).
#include "model/cuda_executor.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/mlp_moe.cuh"
#include "backend/cuda/msa_decode.cuh"
#include "backend/cuda/msa_decode_index.cuh"
#include "backend/cuda/msa_indexer.cuh"
#include "backend/cuda/msa_indexer_tc.cuh"
#include "backend/cuda/msa_prefill.cuh"
#include "backend/cuda/msa_prefill_sparse.cuh"
#include "backend/cuda/msa_prefill_tc.cuh"
#include "backend/cuda/msa_topk.cuh"
#include "backend/cuda/norm_rope.cuh"
#include "backend/cuda/paged_decode_tc.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "engine/request.h"
#include "model/checkpoint.h"
#include "model/cuda_weight_loader.h"
#include "model/device_sampling.h"
#include "model/gpu_step_profile.h"

namespace m3 {

using cuda::DeviceBuffer;

namespace {

// The scale format of the executor's FP8 matrices (docs/FP8.md §2–§5): 128×128 blocks, which cuBLASLt's
// block-scaled GEMM reads for prefill-sized M and W8A16 reads for decode — one copy per tensor; the conversion from
// the release's per-32 scales costs ≤ 4e-6 of ‖y‖ on the MXFP8 fixture.
constexpr Fp8Scale kFp8Fmt = Fp8Scale::Blk128;

// A weight matrix on the device in the executor's weight type, or FP8 (`--dtype fp8`): e4m3 values [N, K] in mem and
// kFp8Fmt scales beside them.
// Stacked routed experts (`count` matrices [N, K] back to back) keep their scale arrays back to back as well.
struct DevMat {
  DeviceBuffer<uint8_t> mem;
  cuda::WType wt = cuda::WType::F32;
  bool fp8 = false;
  DeviceBuffer<uint8_t> scales;
  int64_t N = 0, K = 0, count = 1;
  const float* scales_f32() const { return reinterpret_cast<const float*>(scales.get()); }
  const void* get() const { return mem.get(); }
  cuda::Fp8Weight f8() const {
    return fp8 ? cuda::Fp8Weight{mem.get(), scales.get(), kFp8Fmt, N, K} : cuda::Fp8Weight{};
  }
};

// The slots `--dtype fp8` stores as FP8 (issue 15 items 2–3): attention q/k/v/o, index q/k, dense MLP, shared expert,
// routed experts (stacked, when the grouped MoE takes the layer's shape: it is the only path that reads FP8 experts).
// Embeddings, LM head, norms and router as without fp8.
bool fp8_slot_kind(SlotKind k) {
  switch (k) {
    case SlotKind::Wqkv:
    case SlotKind::Wo:
    case SlotKind::WIndexQk:
    case SlotKind::MlpGateUp:
    case SlotKind::MlpDown:
    case SlotKind::SharedGateUp:
    case SlotKind::SharedDown:
    case SlotKind::ExpertGateUp:
    case SlotKind::ExpertDown: return true;
    default: return false;
  }
}

void put(DevMat& m, const float* src, size_t n, cuda::WType wt) {
  m.wt = wt;
  if (wt == cuda::WType::BF16) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
    m.mem.grow(n * 2);
    M3_CUDA_CHECK(cudaMemcpy(m.mem.get(), h.data(), n * 2, cudaMemcpyHostToDevice));
  } else {
    m.mem.grow(n * 4);
    M3_CUDA_CHECK(cudaMemcpy(m.mem.get(), src, n * 4, cudaMemcpyHostToDevice));
  }
}

void put_f32(DeviceBuffer<float>& d, const std::vector<float>& h) {
  d.grow(h.size());
  if (!h.empty()) M3_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
}

struct DevMlp {
  DevMat gate_up, down;
  int64_t I = 0;
};

struct DevLayer {
  DeviceBuffer<float> input_norm, post_attn_norm, q_norm, k_norm, index_q_norm, index_k_norm;
  DevMat wqkv, wo, w_index_qk;
  DevMlp mlp, shared;
  DeviceBuffer<float> router, router_bias;
  DevMat experts_gate_up, experts_down;  // stacked [E, 2I, H] and [E, H, I]
  int64_t expert_I = 0;
};

}  // namespace

struct CudaExecutor::Impl {
  M3Config c;
  CudaExecutorOptions opt;
  std::unique_ptr<PagePool> pool;  // sized after the weights are on the device (num_pages ≤ 0: what fits)
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  std::unique_ptr<cuda::Fp8Gemm> f8gemm;  // --dtype fp8
  int fp8_count = 0;                       // matrices stored as FP8
  cuda::WType wt;

  // Weights.
  DevMat embed, lm_head;
  DeviceBuffer<float> final_norm, inv_freq;
  std::vector<DevLayer> layers;

  // Cache (issue 9): per-layer pools, one page id addresses K, V and index-K of every layer (docs/KV_CACHE.md):
  //   K_l, V_l [P, Hkv, B, D] and IK_l [P, B, Di] (sparse layers only), elements of kv_type. A layer's slabs are
  //   contiguous (TMA, strided virtual-page views) and each pool could get its own dtype or shard later.
  // E4M3 (--kv-cache-dtype fp8): per-tensor scales per layer (value = e4m3 · scale), the options' values until a
  // calibration sets them; ignored for bf16 / fp32.
  struct LayerPools {
    DeviceBuffer<uint8_t> k, v, ik;
    float k_scale = 1.f, v_scale = 1.f, ik_scale = 1.f;
  };
  cuda::KvType kv_type = cuda::KvType::F32;
  std::vector<LayerPools> kvp;
  int64_t kv_page_elems = 0, ik_page_elems = 0;  // Hkv·B·D and B·Di
  // E4M3 only: bf16 staging of ONE layer's pages, K, V [P + 1, Hkv, B, D] and index-K [P + 1, B, Di]. Before a
  // layer's prefill attention the step's pages are dequantised there (same page ids) and the bf16 prefill kernels
  // read it (docs/FP8.md §8.2). Zeroed at allocation (the union-tile prefill reads whole pages: see alloc_kv).
  DeviceBuffer<uint8_t> stage_k, stage_v, stage_ik;

  // Step state. The rows of a step go up in ONE copy from pinned staging (upload_step): [ids | pos | row_seq | slot |
  // head_rows | pt_indptr | pt_pages], each part at a fixed offset for a given (T, S, head rows), so a decode graph
  // of a bucket reads the same addresses at every replay.
  DeviceBuffer<int32_t> d_step, d_sel;
  int32_t* h_step = nullptr;
  size_t h_step_cap = 0;
  const int32_t *d_ids = nullptr, *d_pos = nullptr, *d_row_seq = nullptr, *d_slot = nullptr, *d_head_rows = nullptr,
                *d_pt_indptr = nullptr, *d_pt_pages = nullptr;
  DeviceBuffer<float> x, xn, qkv, q, attn, iqk, iq, scores, hsel, logits;
  DeviceBuffer<uint16_t> qb, iqb, attnb;  // bf16 copies for the tensor-core kernels: q, index q, attention output
  DeviceBuffer<uint16_t> xnb;             // the normalised hidden rows in bf16: the input of the bf16 GEMMs
  DeviceBuffer<uint8_t> xq8;              // FP8 prefill: xnb quantised per 1×128 by the norm (fp8_in), and its scales
  DeviceBuffer<float> xs8;
  cuda::FfnScratch ffn;
  cuda::DenseAttention dense;
  cuda::MsaPrefill msa_prefill;
  cuda::MsaDecode msa_decode;
  cuda::MsaIndexer indexer;
  cuda::MsaIndexerTc indexer_tc;  // tensor-core prefill scores (bf16 index-K cache, Di 128)
  // Tensor-core kernels (docs/KERNELS.md §8–9), used where the shapes are theirs and the cache is bf16.
  cuda::MsaDecodeIndex dec_index;
  cuda::PagedDecodeTc dense_tc, sparse_tc;
  cuda::MsaPrefillUnion msa_union;    // dense causal prefill (run_dense)
  cuda::MsaPrefillSparse msa_sparse;  // sparse prefill: union-tile or KV-block-major, routed per tile on the device
  GpuStepProfile prof;  // M3_STEP_PROFILE=1: per-category GPU time of every step

  LoadStats load_stats;  // how the weights got here (streamed / dummy; zero for the host-fp32 constructor)
  std::string weights_source = "host fp32";

  // Construction in three steps (model/cuda_weight_loader.h): device + stream, then the weights (host fp32 upload,
  // streamed safetensors, or dummy), then the KV pools sized by what the weights left free.
  Impl(const M3Config& cfg, CudaExecutorOptions o);
  Impl(const M3Config& cfg, const M3Weights& w, int32_t num_pages, CudaExecutorOptions o) : Impl(cfg, o) {
    upload(w);
    alloc_kv(num_pages);
  }
  void upload(const M3Weights& w);
  void alloc_kv(int32_t num_pages);
  // --kv-cache-dtype fp8: every path a step may take must have an e4m3 reader (the tensor-core decode) or go through
  // the staging pool into a bf16 tensor-core prefill kernel; refuses everything else with the reason.
  void check_fp8_kv() const;
  // The device storage of one weight slot (model/weight_plan.h), allocated on first use; what the streaming loader
  // and the dummy fill write into.
  // fp8_ok: the slot may be stored as FP8 (its checkpoint pieces are MXFP8, or dummy weights); with
  // opt.fp8_weights an fp8_slot_kind slot whose K suits every FP8 kernel then is. A slot keeps the storage of its
  // first bind.
  DeviceSlot bind(const WeightSlot& s, bool fp8_ok = false);
  // One projection y[T, N] (+)= x[T, K] · Wᵀ with bf16 activations, fp32 out: FP8 weights through Fp8Gemm::proj,
  // bf16 through Gemm::nt_bf16.
  // Decode rows go through the weight-streaming GEMV (backend/cuda/gemv.cuh) where it measured faster on the H200
  // (M3 shapes): FP8 weights at T ≤ 4 (the tensor-core e4m3 GEMV beats the W8A16 mma on every shape up to T = 4,
  // 1.1–1.8×, not at T = 8; bench/results/2026-12-03c-fp8-decode-h200.md), bf16 at T = 1 (2–6 % over cuBLASLt; from
  // T = 2 on cuBLASLt wins, bench/results/2026-12-03-gemv-h200.md). M3_GEMV=0 never, =1 for every T it supports (≤ 8).
  // xq: xb already quantised by its writer (fp8_in), used where the projection takes cuBLASLt FP8×FP8.
  void proj(const uint16_t* xb, int64_t T, int64_t K, const DevMat& W, int64_t N, float* y, bool accumulate,
            cudaStream_t s, const cuda::Fp8ActOut* xq = nullptr) {
    if (W.fp8) {
      M3_CHECK(W.K == K && W.N == N, "CUDA executor: FP8 matrix [{}, {}] used as [{}, {}]", W.N, W.K, N, K);
      if (T <= gemv_max_rows(true) && cuda::gemv_supported(T, K, true))
        cuda::gemv_e4m3(xb, T, W.f8(), y, cuda::GemmOut::F32, accumulate, s);
      else
        f8gemm->proj(xb, T, W.f8(), y, cuda::GemmOut::F32, accumulate, opt.fp8_lt_min_rows, s, xq);
    } else if (T <= gemv_max_rows(false) && cuda::gemv_supported(T, K, false)) {
      cuda::gemv_bf16(xb, T, K, static_cast<const uint16_t*>(W.get()), N, y, cuda::GemmOut::F32, accumulate, s);
    } else {
      gemm->nt_bf16(xb, T, K, W.get(), N, y, accumulate, s);
    }
  }
  // Whether proj() of T rows of W quantises its input for cuBLASLt FP8×FP8 — then the writer of the input (the RMS
  // norm here, the SwiGLU inside run_mlp) does it in its own pass, bit-identical (docs/FP8.md §3).
  bool fp8_in(const DevMat& W, int64_t T) const {
    const bool gemv = T <= gemv_max_rows(true) && cuda::gemv_supported(T, W.K, true);
    return cuda::fp8_fused_quant() && W.fp8 && W.K % 128 == 0 && !gemv &&
           cuda::Fp8Gemm::proj_quantises(T, W.f8(), opt.fp8_lt_min_rows);
  }
  // The norm of x into xnb (bf16) and, when `quant`, into xq8 / xs8 per 1×128 as well (returned; else null).
  const cuda::Fp8ActOut* norm_bf16(const float* xs, int64_t T, int64_t H, const float* w, bool quant,
                                   cuda::Fp8ActOut& q, cudaStream_t s) {
    if (!quant) {
      cuda::rms_norm_gemma_bf16(xs, T, H, w, c.rms_norm_eps, xnb.get(), nullptr, s);
      return nullptr;
    }
    const int64_t Tp = (T + 3) / 4 * 4;
    xq8.grow(size_t(Tp * H));
    xs8.grow(size_t(Tp * (H / 128)));
    q = cuda::Fp8ActOut{xq8.get(), xs8.get(), Tp, Tp};
    cuda::rms_norm_gemma_bf16_e4m3(xs, T, H, w, c.rms_norm_eps, xnb.get(), q, s);
    return &q;
  }
  const int gemv_mode = [] {  // -1: the measured policy; 0: off; 1: every supported T
    const char* e = std::getenv("M3_GEMV");
    return e && std::string(e) == "0" ? 0 : e && std::string(e) == "1" ? 1 : -1;
  }();
  int64_t gemv_max_rows(bool e4m3) const {
    return gemv_mode == 0 ? 0 : gemv_mode == 1 ? cuda::kGemvMaxRows : e4m3 ? 4 : 1;
  }
  // The dense MLP's bf16 GEMMs (24576 × 6144 and 6144 × 12288 in M3) take the GEMV at the bf16 policy's rows too:
  // 116 vs 121 µs per layer in the decode graph, and the graph's first cuBLASLt GEMM ran 0.2–0.25 ms long (the
  // first dense MLP: 375 µs; bench/results/2026-12-03-decode-step-h200.md). M3_GEMV_MLP=0: cuBLASLt.
  const bool gemv_mlp = [] {
    const char* e = std::getenv("M3_GEMV_MLP");
    return !(e && std::string(e) == "0");
  }();
  int64_t gemv_mlp_rows(bool e4m3) const { return gemv_mlp ? gemv_max_rows(e4m3) : 0; }
  // FP8 experts at prefill sizes on the e4m3 wgmma GEMMs (docs/FP8.md §9); M3_MOE_FP8_E4M3=0 (A/B only): the W8A16
  // mma.sync GEMMs at every size, as `--fp8-prefill-gemm w8a16` does for the MoE.
  const bool moe_fp8_e4m3 = [] {
    const char* e = std::getenv("M3_MOE_FP8_E4M3");
    return !(e && std::string(e) == "0");
  }();
  ~Impl() {
    drop_graphs();
    if (h_step) cudaFreeHost(h_step);
    if (stream) cudaStreamDestroy(stream);
  }
  cuda::DevPagedKV kv_view(int l) {
    return cuda::DevPagedKV{kvp[size_t(l)].k.get(), kvp[size_t(l)].v.get(), kv_page_elems, c.num_kv_heads,
                            c.sparse_block_size, c.head_dim, kv_type};
  }
  cuda::DevPagedIndexK ik_view(int l) {
    return cuda::DevPagedIndexK{kvp[size_t(l)].ik.get(), ik_page_elems, c.sparse_block_size, c.index_head_dim,
                                kv_type};
  }
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace);
  // The tensor-core paged decode of one layer over planned page lists (q in qb, bf16 output in attnb), in the
  // instantiation of the cache's element type (e4m3: the layer's k_scale / v_scale).
  void run_decode_tc(cuda::PagedDecodeTc& k, const cuda::DevPagedKV& kv, const LayerPools& lp, const int32_t* indptr,
                     const int32_t* indices, const int32_t* last_len, int64_t T, cudaStream_t s) {
    const int64_t B = c.sparse_block_size, D = c.head_dim;
    auto fill = [&](auto& pa) {
      pa.q = reinterpret_cast<const __nv_bfloat16*>(qb.get());
      pa.out = reinterpret_cast<__nv_bfloat16*>(attnb.get());
      pa.stride_page = B * D, pa.stride_tok = D;
      pa.indptr = indptr, pa.indices = indices, pa.last_len = last_len;
      pa.R = int(T * c.num_kv_heads), pa.G = int(c.num_q_heads / c.num_kv_heads);
      pa.scale = 1.0f / std::sqrt(float(D));
    };
    if (kv.type == cuda::KvType::E4M3) {
      cuda::PagedDecodeTcArgs<cuda::e4m3_t> pa;
      fill(pa);
      pa.k = static_cast<const cuda::e4m3_t*>(kv.k), pa.v = static_cast<const cuda::e4m3_t*>(kv.v);
      pa.k_scale = lp.k_scale, pa.v_scale = lp.v_scale;
      k.run(pa, s);
    } else {
      cuda::PagedDecodeTcArgs<__nv_bfloat16> pa;
      fill(pa);
      pa.k = static_cast<const __nv_bfloat16*>(kv.k), pa.v = static_cast<const __nv_bfloat16*>(kv.v);
      k.run(pa, s);
    }
  }
  // The forward up to the LM head: logits [head rows, V] stay in `logits` on the device (forward() copies them out,
  // forward_sample() samples them there).
  StepRows forward_device(std::span<const SeqInput> seqs, ForwardTrace* trace);
  // Its two halves: the step's one upload of its rows, then every launch of the forward. graph = true: the decode
  // step of a graph bucket (docs/ENGINE_STEP.md): plans from the device rows with capacity launch shapes, so the
  // launches depend on the bucket alone and can be captured; the same code runs eagerly before a capture.
  void upload_step(const StepRows& r);
  void enqueue_forward(const StepRows& r, ForwardTrace* trace, bool graph);
  // Vision features (SeqInput::media_embeds) replace the embeddings of the image/video slot rows, in order, as the
  // CPU forward does (model/m3_model.cpp; docs/M3_MODEL.md §5.6): plan_media finds the runs of consecutive slot
  // rows and checks the counts; enqueue_forward copies each run over the embedded rows (eager steps only: decode
  // steps and graphs carry no media).
  struct MediaRun {
    int64_t row = 0;           // first step row of the run
    const float* src = nullptr;  // [n, H] on the host (the request's features; alive for the step)
    int64_t n = 0;
  };
  std::vector<MediaRun> media_runs;
  void plan_media(std::span<const SeqInput> seqs, const StepRows& r);
  cuda::DeviceSampler sampler;  // forward_sample: logits → ids on the device (backend/cuda/sampling.cuh)

  // ---- decode through CUDA graphs (issue 9 item 4) --------------------------------------------------------------
  // A pure decode step (every sequence brings one token, no trace) is padded to a bucket of rows; padding sequences
  // decode token 0 at position 0 into the scratch page (one page past the pool, never handed out). Per bucket, the
  // first step runs eagerly in graph form and is then captured; later steps upload their rows and sampling staging
  // and replay. A graph bakes device addresses in: when any DeviceBuffer was reallocated since its capture
  // (cuda::alloc_epoch), every graph is dropped and captured again.
  struct DecodeGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;
    std::vector<int8_t> prof_cats;  // the step profile's intervals recorded by the graph's event nodes
    bool failed = false;            // capture failed once: this bucket stays eager
  };
  std::vector<std::pair<int, DecodeGraph>> graphs;  // by bucket
  int32_t scratch_page = 0;      // = pool capacity: the padding rows' page
  int64_t graph_page_cap = 0;    // capacity of pages per sequence (launch shapes of the graph plans)
  GraphStats graph_stats;
  static const std::vector<int>& buckets();
  int bucket_for(size_t n) const;  // 0: no bucket (eager)
  bool graph_eligible(std::span<const SeqInput> seqs, std::span<const RowSampling> rows) const;
  std::vector<SampledToken> decode_graph_step(std::span<const SeqInput> seqs, std::span<const RowSampling> rows,
                                              const std::function<void()>& before_sampling);
  bool capture(DecodeGraph& g, const StepRows& r);
  void drop_graphs();
};

CudaExecutor::Impl::Impl(const M3Config& cfg, CudaExecutorOptions o)
    : c(cfg), opt(o), wt(o.bf16_weights ? cuda::WType::BF16 : cuda::WType::F32) {
  M3_CHECK(cuda::device_count() > opt.device, "CUDA executor: no CUDA device {} (found {})", opt.device,
           cuda::device_count());
  M3_CHECK(c.index_num_heads == c.num_kv_heads || c.num_sparse_layers() == 0,
           "CUDA executor: {} index heads for {} KV heads (MSA needs one index head per KV head)", c.index_num_heads,
           c.num_kv_heads);
  M3_CHECK(c.num_q_heads % c.num_kv_heads == 0, "CUDA executor: {} query heads not a multiple of {} KV heads",
           c.num_q_heads, c.num_kv_heads);
  if (opt.fp8_kv) check_fp8_kv();  // before anything is allocated
  M3_CUDA_CHECK(cudaSetDevice(opt.device));
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm = std::make_unique<cuda::Gemm>();
  M3_CHECK(!opt.fp8_weights || opt.bf16_weights, "CUDA executor: FP8 weights need bf16 activations (bf16_weights)");
  if (opt.fp8_weights) f8gemm = std::make_unique<cuda::Fp8Gemm>();
  put_f32(inv_freq, cuda::rope_inv_freq(c.rotary_dim, c.rope_theta));
  layers.resize(size_t(c.num_layers));
}

void CudaExecutor::Impl::upload(const M3Weights& w) {
  M3_CHECK(!opt.fp8_weights, "CUDA executor: FP8 weights come from CudaExecutor::load (MXFP8) or dummy");
  const int64_t H = c.hidden_size;
  put(embed, w.embed.data(), w.embed.size(), wt);
  put(lm_head, w.lm_head.data(), w.lm_head.size(), wt);
  put_f32(final_norm, w.final_norm);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    DevLayer& d = layers[l];
    put_f32(d.input_norm, L.input_norm);
    put_f32(d.post_attn_norm, L.post_attn_norm);
    put_f32(d.q_norm, L.q_norm);
    put_f32(d.k_norm, L.k_norm);
    put(d.wqkv, L.wqkv.data(), L.wqkv.size(), wt);
    put(d.wo, L.wo.data(), L.wo.size(), wt);
    if (c.attn_kinds[l] == AttnKind::Sparse) {
      put(d.w_index_qk, L.w_index_qk.data(), L.w_index_qk.size(), wt);
      put_f32(d.index_q_norm, L.index_q_norm);
      put_f32(d.index_k_norm, L.index_k_norm);
    }
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      put(d.mlp.gate_up, L.mlp.gate_up.data(), L.mlp.gate_up.size(), wt);
      put(d.mlp.down, L.mlp.down.data(), L.mlp.down.size(), wt);
      d.mlp.I = L.mlp.intermediate;
    } else {
      put_f32(d.router, L.router);  // the router stays fp32 (M3 ships it in fp32)
      put_f32(d.router_bias, L.router_bias);
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      std::vector<float> gu, dn;
      gu.reserve(size_t(E * 2 * I * H));
      dn.reserve(size_t(E * H * I));
      for (const MlpWeights& e : L.experts) {
        gu.insert(gu.end(), e.gate_up.begin(), e.gate_up.end());
        dn.insert(dn.end(), e.down.begin(), e.down.end());
      }
      put(d.experts_gate_up, gu.data(), gu.size(), wt);
      put(d.experts_down, dn.data(), dn.size(), wt);
      d.expert_I = I;
      if (!L.shared.gate_up.empty()) {
        put(d.shared.gate_up, L.shared.gate_up.data(), L.shared.gate_up.size(), wt);
        put(d.shared.down, L.shared.down.data(), L.shared.down.size(), wt);
        d.shared.I = L.shared.intermediate;
      }
    }
  }
}

DeviceSlot CudaExecutor::Impl::bind(const WeightSlot& s, bool fp8_ok) {
  const bool bf16 = s.matrix && wt == cuda::WType::BF16;
  const size_t esz = bf16 ? 2 : 4, n = size_t(s.numel());
  const int64_t cols = s.pieces.empty() ? 0 : s.pieces[0].shape.back();
  const bool expert = s.kind == SlotKind::ExpertGateUp || s.kind == SlotKind::ExpertDown;
  // Routed experts: whenever the grouped MoE takes the layer (its W8A16 GEMMs read K % 16, which H % 64 and
  // I % 32 give), for gate_up and down alike; other matrices: when every FP8 projection kernel takes K.
  const bool want_fp8 = opt.fp8_weights && fp8_ok && s.matrix && fp8_slot_kind(s.kind) &&
                        (expert ? cuda::moe_grouped_supported(c.hidden_size, c.num_experts, c.num_experts_per_tok,
                                                              c.moe_intermediate_size, c.shared_intermediate_size)
                                : fp8_matrix_supported(s.rows(), cols));
  auto mat = [&](DevMat& m, size_t elems, size_t at) {
    // FP8 storage: whole slots, or stacked experts (slot e at matrix e; the first expert bound decides the storage
    // of the stack — a later expert that is not MXFP8 then fails in the loader with the tensor named).
    if (m.fp8 || (want_fp8 && !m.mem.get())) {
      const int64_t count = int64_t(elems / n), e = int64_t(at / n);
      if (!m.fp8) {
        M3_CHECK(expert || (at == 0 && elems == n), "CUDA executor: FP8 storage for a stacked slot {}", s.label());
        m.fp8 = true, m.wt = wt, m.N = s.rows(), m.K = cols, m.count = count;
        m.mem.grow(size_t(count * m.N * m.K));
        m.scales.grow(size_t(count * fp8_scale_count(kFp8Fmt, m.N, m.K)) * 4);
        ++fp8_count;
      }
      M3_CHECK(m.N == s.rows() && m.K == cols && e < m.count, "CUDA executor: FP8 slot {} does not fit its stack",
               s.label());
      return DeviceSlot{m.mem.get() + e * m.N * m.K, false, true, kFp8Fmt,
                        m.scales.get() + e * fp8_scale_count(kFp8Fmt, m.N, m.K) * 4};
    }
    m.wt = wt;
    m.mem.grow(elems * esz);  // keeps an existing allocation of that size (experts share one stacked buffer)
    return DeviceSlot{m.mem.get() + at * esz, bf16};
  };
  auto vec = [&](DeviceBuffer<float>& d) {
    d.grow(n);
    return DeviceSlot{d.get(), false};
  };
  if (s.layer < 0) {
    if (s.kind == SlotKind::FinalNorm) return vec(final_norm);
    return mat(s.kind == SlotKind::Embed ? embed : lm_head, n, 0);
  }
  DevLayer& d = layers[size_t(s.layer)];
  switch (s.kind) {
    case SlotKind::InputNorm: return vec(d.input_norm);
    case SlotKind::PostAttnNorm: return vec(d.post_attn_norm);
    case SlotKind::QNorm: return vec(d.q_norm);
    case SlotKind::KNorm: return vec(d.k_norm);
    case SlotKind::IndexQNorm: return vec(d.index_q_norm);
    case SlotKind::IndexKNorm: return vec(d.index_k_norm);
    case SlotKind::Router: return vec(d.router);
    case SlotKind::RouterBias: return vec(d.router_bias);
    case SlotKind::Wqkv: return mat(d.wqkv, n, 0);
    case SlotKind::Wo: return mat(d.wo, n, 0);
    case SlotKind::WIndexQk: return mat(d.w_index_qk, n, 0);
    case SlotKind::MlpGateUp: d.mlp.I = c.dense_intermediate_size; return mat(d.mlp.gate_up, n, 0);
    case SlotKind::MlpDown: return mat(d.mlp.down, n, 0);
    case SlotKind::SharedGateUp: d.shared.I = c.shared_intermediate_size; return mat(d.shared.gate_up, n, 0);
    case SlotKind::SharedDown: return mat(d.shared.down, n, 0);
    case SlotKind::ExpertGateUp:  // stacked [E, 2I, H]
      d.expert_I = c.moe_intermediate_size;
      return mat(d.experts_gate_up, n * size_t(c.num_experts), n * size_t(s.expert));
    case SlotKind::ExpertDown:  // stacked [E, H, I]
      return mat(d.experts_down, n * size_t(c.num_experts), n * size_t(s.expert));
    default: break;
  }
  fail("CUDA executor: no device storage for weight slot {}", s.label());
}

void CudaExecutor::Impl::alloc_kv(int32_t num_pages) {
  // KV pools: bf16 with bf16 weights (serving), fp32 with fp32 weights (the exact verification path), e4m3 with
  // --kv-cache-dtype fp8 (plus the bf16 staging pool of one layer).
  const int64_t B = c.sparse_block_size, D = c.head_dim;
  kv_type = opt.fp8_kv ? cuda::KvType::E4M3 : wt == cuda::WType::BF16 ? cuda::KvType::BF16 : cuda::KvType::F32;
  kv_page_elems = c.num_kv_heads * B * D;
  ik_page_elems = B * c.index_head_dim;
  const int64_t page_bytes = CudaExecutor::page_bytes_for(c, opt);
  if (num_pages <= 0) {
    // Automatic size: 90 % of the free device memory minus 1 GiB of headroom for activations and workspaces, at
    // most 64 sequences of max_position_embeddings tokens.
    size_t free_b = 0, total_b = 0;
    M3_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double budget = std::max(0.0, 0.9 * double(free_b) - double(size_t(1) << 30));
    int64_t n = int64_t(budget / double(page_bytes));
    if (c.max_position_embeddings > 0) n = std::min<int64_t>(n, 64 * ((c.max_position_embeddings + B - 1) / B));
    n = std::min<int64_t>(n, int64_t(1) << 22);
    M3_CHECK(n >= 1, "CUDA executor: no device memory left for the KV cache ({} MiB free)", free_b >> 20);
    num_pages = int32_t(n);
  }
  pool = std::make_unique<PagePool>(num_pages);
  // One page more than the pool hands out: the scratch page the padding rows of a decode graph write to.
  scratch_page = num_pages;
  graph_page_cap = std::min<int64_t>(num_pages, (std::max<int64_t>(c.max_position_embeddings, 1) + B - 1) / B);
  const int64_t alloc_pages = int64_t(num_pages) + 1;
  const size_t esz = cuda::kv_elem_bytes(kv_type);
  // Initial contents. fp32 (verification): NaN poison (0xFF…), so a read of a slot nothing wrote shows up in the
  // logits — the v1 kernels never read past a row's last valid token. bf16 (serving): zeros, as vLLM does, because
  // the union-tile prefill (msa_prefill_tc.cu) loads whole pages by TMA and multiplies the masked probabilities
  // (exact zeros) by every V row of the page: those rows must be finite. Afterwards a slot only ever holds what the
  // model wrote, so the invariant lasts as pages are reused.
  // e4m3: zeros too (code 0 is +0), for the same reason: the staging copies of unwritten slots must be finite.
  const int fill = kv_type == cuda::KvType::F32 ? 0xFF : 0;
  kvp.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerPools& lp = kvp[size_t(l)];
    lp.k_scale = opt.kv_k_scale, lp.v_scale = opt.kv_v_scale, lp.ik_scale = opt.kv_index_scale;
    const size_t kv_bytes = size_t(alloc_pages) * size_t(kv_page_elems) * esz;
    lp.k.grow(kv_bytes);
    lp.v.grow(kv_bytes);
    M3_CUDA_CHECK(cudaMemset(lp.k.get(), fill, kv_bytes));
    M3_CUDA_CHECK(cudaMemset(lp.v.get(), fill, kv_bytes));
    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const size_t ik_bytes = size_t(alloc_pages) * size_t(ik_page_elems) * esz;
      lp.ik.grow(ik_bytes);
      M3_CUDA_CHECK(cudaMemset(lp.ik.get(), fill, ik_bytes));
    }
  }
  if (kv_type == cuda::KvType::E4M3) {
    const size_t kv_bytes = size_t(alloc_pages) * size_t(kv_page_elems) * 2;
    stage_k.grow(kv_bytes), stage_v.grow(kv_bytes);
    M3_CUDA_CHECK(cudaMemset(stage_k.get(), 0, kv_bytes));
    M3_CUDA_CHECK(cudaMemset(stage_v.get(), 0, kv_bytes));
    if (c.num_sparse_layers() > 0) {
      const size_t ik_bytes = size_t(alloc_pages) * size_t(ik_page_elems) * 2;
      stage_ik.grow(ik_bytes);
      M3_CUDA_CHECK(cudaMemset(stage_ik.get(), 0, ik_bytes));
    }
  }
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaExecutor::Impl::check_fp8_kv() const {
  M3_CHECK(opt.bf16_weights,
           "CUDA executor: --kv-cache-dtype fp8 needs bf16 (or fp8) weights; the float32 verification path keeps a "
           "float32 cache");
  M3_CHECK(opt.attention != AttentionBackend::MsaV1,
           "CUDA executor: --kv-cache-dtype fp8 does not run with --attention msa-v1 (the v1 kernels read float32 / "
           "bfloat16 caches only)");
  for (float sc : {opt.kv_k_scale, opt.kv_v_scale, opt.kv_index_scale})
    M3_CHECK(std::isfinite(sc) && sc > 0.f, "CUDA executor: FP8 KV scale {} (must be finite and > 0)", sc);
  const int64_t G = c.num_q_heads / c.num_kv_heads;
  M3_CHECK(c.head_dim == 128 && c.sparse_block_size == 128 && G == 16,
           "CUDA executor: --kv-cache-dtype fp8 needs head dim 128, 128-token pages and 16 query heads per KV head "
           "(the tensor-core kernels' shapes); this model has head dim {}, pages of {}, {} query heads per KV head",
           c.head_dim, c.sparse_block_size, G);
  const bool sparse = opt.attention != AttentionBackend::Dense && c.num_sparse_layers() > 0;
  const int64_t Hi = c.index_num_heads, K = c.sparse_topk_blocks;
  M3_CHECK(!sparse || (c.index_head_dim == 128 && Hi >= 1 && Hi <= cuda::MsaDecodeIndex::kMaxHeads && 128 % Hi == 0 &&
                       K <= 16 && K <= cuda::MsaDecodeIndex::kMaxTopK && K <= cuda::MsaIndexerTc::kMaxTopK),
           "CUDA executor: --kv-cache-dtype fp8 needs index dim 128, 1 to {} index heads and top-k ≤ 16 (the "
           "tensor-core indexers' shapes); this model has index dim {}, {} index heads, top-{}",
           cuda::MsaDecodeIndex::kMaxHeads, c.index_head_dim, Hi, K);
}

StepRows CudaExecutor::Impl::forward_device(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  M3_CHECK(!seqs.empty(), "forward: no sequences");
  // ---- plan: rows of the step (model/step_plan.h, shared with the CPU forward) ------------------------------
  StepRows r = StepRows::build(c, seqs, pool->capacity());
  plan_media(seqs, r);
  upload_step(r);
  enqueue_forward(r, trace, false);
  return r;
}

void CudaExecutor::Impl::plan_media(std::span<const SeqInput> seqs, const StepRows& r) {
  media_runs.clear();
  const int64_t H = c.hidden_size;
  for (size_t q = 0; q < seqs.size(); ++q) {
    const auto& me = seqs[q].media_embeds;
    if (me.empty()) continue;
    int64_t used = 0;
    for (int64_t t = r.seq_begin[q]; t < r.seq_begin[q + 1]; ++t) {
      const int32_t id = r.ids[size_t(t)];
      if (id < 0 || (id != c.image_token_id && id != c.video_token_id)) continue;
      M3_CHECK((used + 1) * H <= int64_t(me.size()), "sequence {}: more image/video slot tokens than media rows", q);
      if (!media_runs.empty() && media_runs.back().row + media_runs.back().n == t &&
          media_runs.back().src + media_runs.back().n * H == me.data() + used * H)
        ++media_runs.back().n;
      else
        media_runs.push_back({t, me.data() + used * H, 1});
      ++used;
    }
    M3_CHECK(used * H == int64_t(me.size()), "sequence {}: {} image/video slot tokens but {} media rows", q, used,
             me.size() / size_t(H));
  }
}

void CudaExecutor::Impl::upload_step(const StepRows& r) {
  const size_t T = size_t(r.num_rows()), HR = r.head_rows.size(), S = r.pt_indptr.size();
  const size_t n = 4 * T + HR + S + r.pt_pages.size();
  if (n > h_step_cap) {  // pinned, so the copy is a true async DMA; the previous step has synchronised by now
    if (h_step) M3_CUDA_CHECK(cudaFreeHost(h_step));
    h_step = nullptr;
    h_step_cap = std::max(n, 2 * h_step_cap);
    M3_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_step), h_step_cap * 4));
  }
  int32_t* h = h_step;
  auto put_part = [&](const std::vector<int32_t>& v) {
    std::memcpy(h, v.data(), v.size() * 4);
    h += v.size();
  };
  put_part(r.ids), put_part(r.pos), put_part(r.row_seq), put_part(r.slot), put_part(r.head_rows);
  put_part(r.pt_indptr), put_part(r.pt_pages);
  // Grow with headroom: a reallocation invalidates every captured graph (cuda::alloc_epoch).
  if (d_step.size() < n) d_step.grow(std::max(n, d_step.size() + d_step.size() / 2));
  M3_CUDA_CHECK(cudaMemcpyAsync(d_step.get(), h_step, n * 4, cudaMemcpyHostToDevice, stream));
  const int32_t* d = d_step.get();
  d_ids = d, d_pos = d + T, d_row_seq = d + 2 * T, d_slot = d + 3 * T, d_head_rows = d + 4 * T;
  d_pt_indptr = d + 4 * T + HR, d_pt_pages = d_pt_indptr + S;
}

void CudaExecutor::Impl::enqueue_forward(const StepRows& plan_rows, ForwardTrace* trace, bool graph) {
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_q_heads, Hkv = c.num_kv_heads;
  const int64_t B = c.sparse_block_size, V = c.vocab_size, G = Hq / Hkv;
  cudaStream_t s = stream;
  const std::vector<int32_t>& pos = plan_rows.pos;
  const std::vector<int32_t>& row_seq = plan_rows.row_seq;
  const std::vector<int64_t>& seq_begin = plan_rows.seq_begin;
  const int max_n = plan_rows.max_new_tokens;
  const int64_t T = plan_rows.num_rows();
  const cuda::DevStepRows rows{d_pos, d_row_seq, d_pt_indptr, d_pt_pages, int(T)};
  const bool fp8kv = kv_type == cuda::KvType::E4M3;
  // Decode / speculative verify rows: split-K and the decode indexer launch. An e4m3 cache has no v1 decode reader,
  // so a decode step too large for the tensor-core decode kernels runs the (staged) prefill kernels instead.
  const bool decode = max_n <= 16 && !(fp8kv && T > cuda::MsaDecodeIndex::kMaxRows);
  prof.begin(decode, s);
  const int64_t ppu = Hkv;  // virtual pages per physical page in a per-layer pool [P, Hkv, B, D]
  const bool dense_only = opt.attention == AttentionBackend::Dense;  // MSA layers run dense attention (baseline)
  const bool any_dense =
      dense_only || std::count(c.attn_kinds.begin(), c.attn_kinds.end(), AttnKind::Dense) > 0;
  const bool any_sparse = !dense_only && c.num_sparse_layers() > 0;
  const int64_t Hi = c.index_num_heads, Di = c.index_head_dim, K = c.sparse_topk_blocks;
  // Which kernels run this step. Tensor-core kernels need a bf16 cache, head dim 128 and 128-token pages; the
  // decode ones G ∈ {8, 16} and ≤ 2048 rows, the fused decode indexer index dim 128, ≤ 4 index heads and top-k ≤ 16,
  // the union-tile prefill G = 16 and top-k ≤ 16. Anything else, and --attention msa-v1, runs the v1 kernels.
  // e4m3 (--kv-cache-dtype fp8): the decode kernels' e4m3 instantiations; prefill runs the bf16 kernels over the
  // staging pool (check_fp8_kv guarantees the shapes, so every step takes the tensor-core kernels).
  const bool tc = opt.attention != AttentionBackend::MsaV1 && (kv_type == cuda::KvType::BF16 || fp8kv) && D == 128 &&
                  B == 128;
  const bool tc_decode = tc && decode && (G == 8 || G == 16) && T <= cuda::MsaDecodeIndex::kMaxRows;
  const bool tc_index = tc_decode && any_sparse && Di == 128 && Hi <= cuda::MsaDecodeIndex::kMaxHeads &&
                        K <= cuda::MsaDecodeIndex::kMaxTopK;
  const bool tc_prefill = tc && !decode && any_sparse && G == 16 && K <= 16;
  const bool tc_dense_prefill = tc && !decode && any_dense && G == 16;  // union kernel in dense causal mode
  const bool tc_prefill_index =  // MsaIndexerTc::run_topk
      tc_prefill && Di == 128 && Hi >= 1 && 128 % Hi == 0 && K <= cuda::MsaIndexerTc::kMaxTopK;
  M3_CHECK(!fp8kv || (decode ? tc_decode && (!any_sparse || tc_index)
                              : (!any_sparse || (tc_prefill && tc_prefill_index)) && (!any_dense || tc_dense_prefill)),
           "CUDA executor: an FP8 KV step without its tensor-core kernels (check_fp8_kv missed a shape)");
  if (tc_dense_prefill) msa_union.plan(T, int(Hkv), int(G), int(D), int(B), 16);
  if (tc_prefill)  // steps whose rows all have fixed selections and narrow unions skip the router (union_only)
    msa_sparse.plan(T, int(Hkv), int(G), int(D), int(B), int(K), int64_t(pool->capacity()),
                    cuda::MsaPrefillSparse::Mode::Auto, &pos, &row_seq);
  // graph: only device-side plans with capacity launch shapes (graph_eligible guarantees the tensor-core decode).
  M3_CHECK(!graph || (tc_decode && (!any_sparse || tc_index) && !trace), "CUDA executor: step cannot run as a graph");
  if (any_dense && !tc_dense_prefill) {
    if (graph) {
      dense.plan_device(rows, int(Hkv), int(G), int(D), int(B), ppu, int(graph_page_cap), s);
      dense_tc.plan(int(T * Hkv), int(G), int(graph_page_cap), true, /*dynamic=*/true);
    } else {
      dense.plan(pos, rows, int(Hkv), int(G), int(D), int(B), ppu, decode, s);
      if (tc_decode) dense_tc.plan(int(T * Hkv), int(G), dense.max_pages(), true);
    }
  }
  prof.mark(GpuStepProfile::kEmbedNorm, s);  // (M3_STEP_PROFILE=2 shows the plans' pieces apart)
  if (any_sparse) {
    if (tc_index) {
      if (graph) {
        dec_index.plan_device(rows, int(Hi), int(K), ppu, graph_page_cap, s);
        sparse_tc.plan(int(T * Hkv), int(G), int(K), true, /*dynamic=*/true);
      } else {
        dec_index.plan(pos, rows, int(Hi), int(K), ppu, s);
        sparse_tc.plan(int(T * Hkv), int(G), dec_index.max_pages(), true);
      }
    } else {
      if (decode)
        msa_decode.plan(pos, int(Hkv), int(G), int(D), int(B), int(K), true, s);
      else if (!tc_prefill)  // (the union kernel was planned above)
        msa_prefill.plan(pos, int(Hkv), int(G), int(D), int(B), int(K), s);
      if (tc_prefill_index) {
        indexer_tc.plan(pos, row_seq, int(Hi), int(Di), int(B), s);  // fused top-k: no score matrix
      } else {
        indexer.plan(pos, row_seq, int(Hi), int(B), decode, s);
        scores.grow(size_t(Hi * T * indexer.max_cols()));
      }
      d_sel.grow(size_t(Hi * T * K));
    }
    iqk.grow(size_t(T * (Hi + 1) * Di));
    iq.grow(size_t(T * Hi * Di));
    if (tc_index || tc_prefill_index) iqb.grow(size_t(T * Hi * Di));
  }
  if (tc_decode || tc_prefill || tc_dense_prefill) qb.grow(size_t(T * Hq * D));
  if (tc_decode || tc_prefill || tc_dense_prefill || f8gemm) attnb.grow(size_t(T * Hq * D));
  if (f8gemm) {
    f8gemm->reserve(T, std::max<int64_t>({H, Hq * D, c.dense_intermediate_size, c.shared_intermediate_size}));
    const int64_t Tp = (T + 3) / 4 * 4;  // the fused quantisation's buffers (norm_bf16, run_mlp's SwiGLU)
    xq8.grow(size_t(Tp * H));
    xs8.grow(size_t(Tp * ((H + 127) / 128)));
    const int64_t I = std::max<int64_t>(c.dense_intermediate_size, c.shared_intermediate_size);
    ffn.act_q8.grow(size_t(Tp * I));
    ffn.act_s8.grow(size_t(Tp * ((I + 127) / 128)));
  }
  const int64_t qkv_w = (Hq + 2 * Hkv) * D;
  x.grow(size_t(T * H));
  xn.grow(size_t(T * H));
  const bool act_bf16 = wt == cuda::WType::BF16;  // bf16 GEMM inputs straight from the norms
  if (act_bf16) xnb.grow(size_t(T * H));
  qkv.grow(size_t(T * qkv_w));
  q.grow(size_t(T * Hq * D));
  attn.grow(size_t(T * Hq * D));
  if (trace) {
    trace->hidden.assign(trace->capture_hidden ? c.num_layers : 0, {});
    trace->selection.assign(c.num_layers, {});
    trace->block_scores.assign(c.num_layers, {});
    trace->block_scores_cols.assign(seq_begin.size() - 1, 0);
  }

  prof.mark(GpuStepProfile::kEmbedNorm, s);  // the plans' small kernels (and uploads) apart from the embedding
  cuda::embed_rows(embed.get(), wt == cuda::WType::BF16, H, d_ids, T, x.get(), s);
  M3_CHECK(!graph || media_runs.empty(), "forward: media rows in a graph step");
  for (const MediaRun& m : media_runs)  // pageable source: staged before the call returns
    M3_CUDA_CHECK(cudaMemcpyAsync(x.get() + m.row * H, m.src, size_t(m.n * H) * sizeof(float),
                                  cudaMemcpyHostToDevice, s));
  media_runs.clear();
  prof.mark(GpuStepProfile::kEmbedNorm, s);  // the embedding (and media rows)
  const float scale = 1.0f / std::sqrt(float(D));
  for (int l = 0; l < c.num_layers; ++l) {
    DevLayer& L = layers[l];
    const cuda::DevPagedKV kv = kv_view(l);
    const LayerPools& lp = kvp[size_t(l)];
    // FP8 prefill: the staging pool's page ids are the cache's; K is staged unscaled (k_scale goes into the softmax
    // scale, as in the e4m3 decode kernel), V and index-K with their scales.
    const int64_t n_step_pages = int64_t(plan_rows.pt_pages.size());
    const bool stage = fp8kv && !decode;
    const uint16_t* kv_k16 = stage ? reinterpret_cast<const uint16_t*>(stage_k.get()) : static_cast<const uint16_t*>(kv.k);
    const uint16_t* kv_v16 = stage ? reinterpret_cast<const uint16_t*>(stage_v.get()) : static_cast<const uint16_t*>(kv.v);
    const float prefill_scale = stage ? scale * lp.k_scale : scale;
    // ---- attention -------------------------------------------------------------------------------------------
    // bf16 weights: the norm writes the GEMM input in bf16 once (no fp32 copy, no per-GEMM rounding kernel) and q /
    // index q come out of their norm + RoPE in bf16 where a tensor-core kernel reads them — bit-identical to
    // rounding afterwards (docs/ENGINE_STEP.md).
    const bool sparse_layer = c.attn_kinds[l] == AttnKind::Sparse && !dense_only;
    const bool q_bf16 = sparse_layer ? (tc_index || tc_prefill) : (tc_decode || tc_dense_prefill);
    cuda::Fp8ActOut xq_mem{};
    const cuda::Fp8ActOut* xq = nullptr;  // xnb in e4m3 (FP8 prefill), shared by the qkv and index projections
    if (act_bf16) {
      const bool q_index = sparse_layer && fp8_in(L.w_index_qk, T);
      xq = norm_bf16(x.get(), T, H, L.input_norm.get(), fp8_in(L.wqkv, T) || q_index, xq_mem, s);
      prof.mark(GpuStepProfile::kEmbedNorm, s);
      proj(xnb.get(), T, H, L.wqkv, qkv_w, qkv.get(), false, s, xq);
    } else {
      cuda::rms_norm_gemma(x.get(), T, H, L.input_norm.get(), c.rms_norm_eps, xn.get(), s);
      prof.mark(GpuStepProfile::kEmbedNorm, s);
      gemm->nt(xn.get(), T, H, L.wqkv.get(), wt, qkv_w, qkv.get(), false, s);
    }
    prof.mark(GpuStepProfile::kGemm, s);
    cuda::HeadsNormRopeArgs a;
    a.src = qkv.get(), a.src_ld = qkv_w, a.T = int(T), a.D = int(D);
    a.n_q = int(Hq), a.q_col0 = 0, a.q_w = L.q_norm.get(), a.q_out = q.get();
    if (q_bf16) a.q_out_bf16 = qb.get();
    a.n_k = int(Hkv), a.k_col0 = int(Hq * D), a.k_w = L.k_norm.get(), a.k_cache = kv.k, a.k_head_stride = B * D;
    a.n_v = int(Hkv), a.v_col0 = int((Hq + Hkv) * D), a.v_cache = kv.v, a.v_head_stride = B * D;
    a.cache_type = kv.type;
    a.k_scale = lp.k_scale, a.v_scale = lp.v_scale;
    a.pos = d_pos, a.slot_page = d_slot, a.page_stride = kv.page_stride, a.block_size = int(B);
    a.inv_freq = inv_freq.get(), a.rotary_dim = c.rotary_dim, a.eps = c.rms_norm_eps;
    cuda::heads_norm_rope(a, s);
    if (stage) {  // after the write: the chunk's own K/V are read back as the e4m3 values decode will see
      using bf = __nv_bfloat16;
      cuda::kv_dequantize_pages_e4m3(static_cast<const cuda::e4m3_t*>(kv.k), kv_page_elems, d_pt_pages,
                                     n_step_pages, 1.f, reinterpret_cast<bf*>(stage_k.get()), s);
      cuda::kv_dequantize_pages_e4m3(static_cast<const cuda::e4m3_t*>(kv.v), kv_page_elems, d_pt_pages,
                                     n_step_pages, lp.v_scale, reinterpret_cast<bf*>(stage_v.get()), s);
    }
    prof.mark(GpuStepProfile::kAttention, s);  // q/k norm, RoPE and the K/V cache write (+ FP8 staging)

    bool o_bf16 = false;  // the attention output is in attnb (bf16) instead of attn
    if (sparse_layer) {
      const int64_t iw = (Hi + 1) * Di;
      if (act_bf16)
        proj(xnb.get(), T, H, L.w_index_qk, iw, iqk.get(), false, s, xq);
      else
        gemm->nt(xn.get(), T, H, L.w_index_qk.get(), wt, iw, iqk.get(), false, s);
      cuda::HeadsNormRopeArgs b;
      b.src = iqk.get(), b.src_ld = iw, b.T = int(T), b.D = int(Di);
      b.n_q = int(Hi), b.q_col0 = 0, b.q_w = L.index_q_norm.get(), b.q_out = iq.get();
      if (tc_index || tc_prefill_index) b.q_out_bf16 = iqb.get();  // the tensor-core indexers read bf16
      const cuda::DevPagedIndexK ikv = ik_view(l);
      b.n_k = 1, b.k_col0 = int(Hi * Di), b.k_w = L.index_k_norm.get(), b.k_cache = ikv.ik, b.k_head_stride = 0;
      b.cache_type = ikv.type;
      b.k_scale = lp.ik_scale;  // the index branch writes with k_scale
      b.pos = d_pos, b.slot_page = d_slot, b.page_stride = ikv.page_stride, b.block_size = int(B);
      b.inv_freq = inv_freq.get(), b.rotary_dim = c.rotary_dim, b.eps = c.rms_norm_eps;
      cuda::heads_norm_rope(b, s);
      if (stage)
        cuda::kv_dequantize_pages_e4m3(static_cast<const cuda::e4m3_t*>(ikv.ik), ik_page_elems, d_pt_pages,
                                       n_step_pages, lp.ik_scale,
                                       reinterpret_cast<__nv_bfloat16*>(stage_ik.get()), s);
      prof.mark(GpuStepProfile::kIndexer, s);  // index projection, norm, RoPE, index-K write (+ FP8 staging)
      const int32_t* sel = d_sel.get();  // [Hi, T, K]
      if (tc_index) {
        // Fused scorer + top-k + page-list emit, then the tensor-core paged decode over the emitted lists.
        const auto* iqp = reinterpret_cast<const __nv_bfloat16*>(iqb.get());
        if (fp8kv)
          dec_index.run(iqp,
                        cuda::DevPagedIndexKT<cuda::e4m3_t>{static_cast<const cuda::e4m3_t*>(ikv.ik), ikv.page_stride,
                                                            lp.ik_scale},
                        rows, s);
        else
          dec_index.run(iqp,
                        cuda::DevPagedIndexKT<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(ikv.ik),
                                                             ikv.page_stride},
                        rows, s);
        sel = dec_index.selection();
        prof.mark(GpuStepProfile::kIndexer, s);
        run_decode_tc(sparse_tc, kv, lp, dec_index.attn_indptr(), dec_index.attn_indices(), dec_index.attn_last_len(),
                      T, s);
        prof.mark(GpuStepProfile::kAttention, s);
        o_bf16 = true;
      } else {
        if (tc_prefill_index) {  // scores + top-k fused: no score matrix (msa_indexer_tc.cuh)
          const uint16_t* ik16 =
              stage ? reinterpret_cast<const uint16_t*>(stage_ik.get()) : static_cast<const uint16_t*>(ikv.ik);
          indexer_tc.run_topk(iqb.get(), ik16, ikv.page_stride,
                              int64_t(pool->capacity()), rows, int(K), d_sel.get(), s);
        } else {
          indexer.run(iq.get(), ikv, rows, scores.get(), s);
          cuda::msa_topk(scores.get(), int(T), int(Hi), d_pos, int(B), indexer.max_cols(), int(K), d_sel.get(),
                         s);
        }
        prof.mark(GpuStepProfile::kIndexer, s);
        if (tc_prefill) {
          const cuda::DevPagedKVBf16 kvb{kv_k16, kv_v16, kv.page_stride, int64_t(pool->capacity()), int(Hkv), int(B),
                                         int(D)};
          // bf16 output straight into the O projection's input (the fp32 copy would only be rounded there)
          msa_sparse.run(qb.get(), d_sel.get(), rows, kvb, prefill_scale, attn.get(), s, attnb.get());
          o_bf16 = true;
          if (opt.validate) msa_sparse.check(s);
        } else if (decode) {
          msa_decode.run(q.get(), d_sel.get(), rows, kv, scale, attn.get(), s);
          if (opt.validate) msa_decode.check(s);
        } else {
          msa_prefill.run(q.get(), d_sel.get(), rows, kv, scale, attn.get(), s);
          if (opt.validate) msa_prefill.check(s);
        }
        prof.mark(GpuStepProfile::kAttention, s);
      }
      if (trace && trace->capture_selection) {
        std::vector<int32_t> all(size_t(Hi * T * K));
        M3_CUDA_CHECK(cudaMemcpyAsync(all.data(), sel, all.size() * 4, cudaMemcpyDeviceToHost, s));
        M3_CUDA_CHECK(cudaStreamSynchronize(s));
        for (size_t si = 0; si + 1 < seq_begin.size(); ++si) {
          const int64_t t0 = seq_begin[si], n = seq_begin[si + 1] - t0;
          std::vector<int32_t> one(size_t(Hi * n * K));
          for (int64_t h = 0; h < Hi; ++h)
            std::memcpy(&one[size_t(h * n * K)], &all[size_t((h * T + t0) * K)], size_t(n * K) * 4);
          trace->selection[l].push_back(std::move(one));
        }
      }
    } else if (tc_decode) {
      run_decode_tc(dense_tc, kv, lp, dense.indptr(), dense.indices(), dense.last_len(), T, s);
      o_bf16 = true;
    } else if (tc_dense_prefill) {
      const cuda::DevPagedKVBf16 kvb{kv_k16, kv_v16, kv.page_stride, int64_t(pool->capacity()), int(Hkv), int(B),
                                     int(D)};
      msa_union.run_dense(qb.get(), rows, kvb, prefill_scale, attn.get(), s, attnb.get());
      o_bf16 = true;
    } else {
      dense.run(q.get(), kv, scale, attn.get(), s);
    }
    prof.mark(GpuStepProfile::kAttention, s);
    if (!o_bf16 && L.wo.fp8) {  // FP8 projections read bf16 activations: round the fp32 attention output once
      cuda::f32_to_bf16(attn.get(), T * Hq * D, attnb.get(), s);
      o_bf16 = true;
    }
    if (o_bf16)
      proj(attnb.get(), T, Hq * D, L.wo, H, x.get(), true, s);  // x += o
    else
      gemm->nt(attn.get(), T, Hq * D, L.wo.get(), wt, H, x.get(), true, s);  // x += o
    prof.mark(GpuStepProfile::kGemm, s);

    // ---- feed-forward ------------------------------------------------------------------------------------------
    // (MoE layers keep the fp32 norm: the router runs in fp32, and its kernel writes the bf16 expert input itself.)
    // (FP8 shared expert: the norm is written in fp32 for the router and in bf16 for the shared expert, one pass.)
    const bool mlp_bf16 = act_bf16 && c.mlp_kinds[l] == MlpKind::Dense;
    // FP8 routed experts run in the grouped kernels with the shared expert as group E when it is FP8 in both
    // matrices; any other shared expert beside them, and an FP8 shared expert beside bf16 experts, runs on its own
    // (the grouped kernels read one weight type).
    const bool experts_fp8 = c.mlp_kinds[l] != MlpKind::Dense && L.experts_gate_up.fp8;
    M3_CHECK(L.experts_gate_up.fp8 == L.experts_down.fp8,
             "CUDA executor: layer {}'s routed experts are FP8 in one matrix only (gate_up {}, down {}): the checkpoint "
             "must give both as MXFP8 or neither", l, L.experts_gate_up.fp8, L.experts_down.fp8);
    const bool shared_fp8 =
        c.mlp_kinds[l] != MlpKind::Dense && L.shared.I > 0 && (L.shared.gate_up.fp8 || L.shared.down.fp8);
    const bool shared_in_group =
        L.shared.I > 0 && (experts_fp8 ? L.shared.gate_up.fp8 && L.shared.down.fp8 : !shared_fp8);
    const bool shared_alone = c.mlp_kinds[l] != MlpKind::Dense && L.shared.I > 0 && !shared_in_group;
    xq = nullptr;
    if (mlp_bf16)
      xq = norm_bf16(x.get(), T, H, L.post_attn_norm.get(), fp8_in(L.mlp.gate_up, T), xq_mem, s);
    else if (shared_fp8 && shared_alone)
      cuda::rms_norm_gemma_bf16(x.get(), T, H, L.post_attn_norm.get(), c.rms_norm_eps, xnb.get(), xn.get(), s);
    else
      cuda::rms_norm_gemma(x.get(), T, H, L.post_attn_norm.get(), c.rms_norm_eps, xn.get(), s);
    prof.mark(GpuStepProfile::kEmbedNorm, s);
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      const cuda::MlpDev m{L.mlp.gate_up.get(), L.mlp.down.get(), wt, L.mlp.I, L.mlp.gate_up.f8(), L.mlp.down.f8()};
      cuda::run_mlp(*gemm, m, xn.get(), T, H, c.swiglu_alpha, c.swiglu_limit, x.get(), true, ffn, s,
                    mlp_bf16 ? xnb.get() : nullptr, f8gemm.get(), opt.fp8_lt_min_rows, gemv_mlp_rows(m.fp8()), xq);
      prof.mark(GpuStepProfile::kMlp, s);
    } else {
      cuda::MoeArgs m;
      m.router = L.router.get();
      m.router_bias = L.router_bias.size() ? L.router_bias.get() : nullptr;
      const int64_t E = c.num_experts, I = L.expert_I;
      const size_t esz = wt == cuda::WType::BF16 ? 2 : 4;
      if (!experts_fp8)
        for (int64_t e = 0; e < E; ++e)
          m.experts.push_back(cuda::MlpDev{L.experts_gate_up.mem.get() + size_t(e * 2 * I * H) * esz,
                                           L.experts_down.mem.get() + size_t(e * H * I) * esz, wt, I});
      // A shared expert outside the group runs after the routed experts (its own MLP, += x): x + routed + shared
      // summed in that order (the CPU sums routed + shared first; the difference is fp32 rounding).
      if (shared_in_group)
        m.shared = cuda::MlpDev{L.shared.gate_up.get(), L.shared.down.get(), wt, L.shared.I, L.shared.gate_up.f8(),
                                L.shared.down.f8()};
      if (experts_fp8) {  // FP8 experts: the grouped path's W8A16 GEMMs (docs/FP8.md §9)
        m.stacked_gate_up8 = L.experts_gate_up.mem.get(), m.stacked_gate_up8_scales = L.experts_gate_up.scales_f32();
        m.stacked_down8 = L.experts_down.mem.get(), m.stacked_down8_scales = L.experts_down.scales_f32();
        m.expert_I = I;
      } else if (wt == cuda::WType::BF16) {  // the grouped device path (no host sync); fp32 keeps the exact sync path
        m.stacked_gate_up = L.experts_gate_up.mem.get(), m.stacked_down = L.experts_down.mem.get(), m.expert_I = I;
      }
      m.E = E, m.top_k = c.num_experts_per_tok, m.routed_scale = c.routed_scaling_factor;
      m.fp8_e4m3_prefill = opt.fp8_lt_min_rows > 0 && moe_fp8_e4m3;  // --fp8-prefill-gemm w8a16: f16 activations
      m.alpha = c.swiglu_alpha, m.limit = c.swiglu_limit;
      cuda::moe_forward(*gemm, m, xn.get(), T, H, x.get(), ffn, s);
      if (shared_alone) {
        const cuda::MlpDev sh{L.shared.gate_up.get(), L.shared.down.get(), wt, L.shared.I, L.shared.gate_up.f8(),
                              L.shared.down.f8()};
        cuda::run_mlp(*gemm, sh, xn.get(), T, H, c.swiglu_alpha, c.swiglu_limit, x.get(), true, ffn, s,
                      shared_fp8 ? xnb.get() : nullptr, f8gemm.get(), opt.fp8_lt_min_rows);
      }
      prof.mark(GpuStepProfile::kMoe, s);
    }
    if (trace && trace->capture_hidden) {
      trace->hidden[l].resize(size_t(T * H));
      M3_CUDA_CHECK(cudaMemcpyAsync(trace->hidden[l].data(), x.get(), size_t(T * H) * 4, cudaMemcpyDeviceToHost, s));
      M3_CUDA_CHECK(cudaStreamSynchronize(s));
    }
  }

  // ---- head: final norm + LM head on the rows that need logits ---------------------------------------------------
  const int64_t HR = int64_t(plan_rows.head_rows.size());
  hsel.grow(size_t(HR * H));
  logits.grow(size_t(HR * V));
  cuda::gather_rows(x.get(), H, d_head_rows, HR, hsel.get(), s);
  cuda::rms_norm_gemma(hsel.get(), HR, H, final_norm.get(), c.rms_norm_eps, hsel.get(), s);
  gemm->nt(hsel.get(), HR, H, lm_head.get(), wt, V, logits.get(), false, s);
  prof.mark(GpuStepProfile::kHead, s);
}

std::vector<std::vector<float>> CudaExecutor::Impl::forward(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  const int64_t V = c.vocab_size;
  cudaStream_t s = stream;
  const StepRows plan_rows = forward_device(seqs, trace);
  const std::vector<int64_t>& seq_begin = plan_rows.seq_begin;
  std::vector<float> all(plan_rows.head_rows.size() * size_t(V));
  M3_CUDA_CHECK(cudaMemcpyAsync(all.data(), logits.get(), all.size() * 4, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<std::vector<float>> out;
  size_t at = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const int64_t rows_s = seqs[si].all_logits ? seq_begin[si + 1] - seq_begin[si] : 1;
    out.emplace_back(all.begin() + int64_t(at) * V, all.begin() + int64_t(at + size_t(rows_s)) * V);
    at += size_t(rows_s);
  }
  return out;
}

CudaExecutor::CudaExecutor(const M3Config& cfg, const M3Weights& weights, int32_t num_pages, CudaExecutorOptions opt)
    : impl_(std::make_unique<Impl>(cfg, weights, num_pages, opt)) {}

CudaExecutor::CudaExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<CudaExecutor> CudaExecutor::load(const std::string& model_dir, int32_t num_pages,
                                                 CudaExecutorOptions opt) {
  namespace fs = std::filesystem;
  M3_CHECK(fs::is_directory(model_dir), "model directory {} does not exist", model_dir);
  return load(load_m3_config((fs::path(model_dir) / "config.json").string()), model_dir, num_pages, opt);
}

std::unique_ptr<CudaExecutor> CudaExecutor::load(const M3Config& cfg, const std::string& model_dir,
                                                 int32_t num_pages, CudaExecutorOptions opt, StreamOptions stream) {
  const SafeTensors st = SafeTensors::open(model_dir);
  auto impl = std::make_unique<Impl>(cfg, opt);
  Impl& m = *impl;
  m.load_stats = stream_weights_to_device(
      st, weight_plan(cfg),
      [&m, &st](const WeightSlot& s) { return m.bind(s, m.opt.fp8_weights && slot_is_mxfp8(st, s)); }, m.stream,
      stream);
  m.weights_source = "safetensors, streamed";
  m.alloc_kv(num_pages);
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

std::unique_ptr<CudaExecutor> CudaExecutor::dummy(const M3Config& cfg, uint64_t seed, int32_t num_pages,
                                                  CudaExecutorOptions opt) {
  auto impl = std::make_unique<Impl>(cfg, opt);
  Impl& m = *impl;
  m.load_stats =
      fill_dummy_weights(weight_plan(cfg), [&m](const WeightSlot& s) { return m.bind(s, true); }, seed, m.stream);
  m.weights_source = "dummy";
  m.alloc_kv(num_pages);
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

const LoadStats& CudaExecutor::load_stats() const { return impl_->load_stats; }

std::vector<uint8_t> CudaExecutor::weight_bytes(const WeightSlot& s) const {
  const DeviceSlot d = impl_->bind(s);
  M3_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  if (d.fp8) {
    const int64_t rows = s.rows(), cols = s.pieces[0].shape.back();
    const size_t nq = size_t(rows * cols), ns = size_t(fp8_scale_count(d.fp8_fmt, rows, cols)) * 4;
    std::vector<uint8_t> out(nq + ns);
    M3_CUDA_CHECK(cudaMemcpy(out.data(), d.ptr, nq, cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(out.data() + nq, d.scales, ns, cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<uint8_t> out(size_t(s.numel()) * (d.bf16 ? 2 : 4));
  M3_CUDA_CHECK(cudaMemcpy(out.data(), d.ptr, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

int64_t CudaExecutor::weight_device_bytes() const {
  const Impl& m = *impl_;
  int64_t b = 0;
  auto mat = [&](const DevMat& d) { b += int64_t(d.mem.size() + d.scales.size()); };
  auto vec = [&](const DeviceBuffer<float>& d) { b += int64_t(d.size()) * 4; };
  mat(m.embed), mat(m.lm_head), vec(m.final_norm);
  for (const DevLayer& L : m.layers) {
    for (const DeviceBuffer<float>* v : {&L.input_norm, &L.post_attn_norm, &L.q_norm, &L.k_norm, &L.index_q_norm,
                                         &L.index_k_norm, &L.router, &L.router_bias})
      vec(*v);
    for (const DevMat* d : {&L.wqkv, &L.wo, &L.w_index_qk, &L.mlp.gate_up, &L.mlp.down, &L.shared.gate_up,
                            &L.shared.down, &L.experts_gate_up, &L.experts_down})
      mat(*d);
  }
  return b;
}

int CudaExecutor::fp8_matrices() const { return impl_->fp8_count; }

int64_t CudaExecutor::page_bytes_for(const M3Config& c, const CudaExecutorOptions& o) {
  const int64_t B = c.sparse_block_size, esz = o.fp8_kv ? 1 : o.bf16_weights ? 2 : 4;
  const int64_t kv = 2 * c.num_kv_heads * B * c.head_dim, ik = B * c.index_head_dim;
  const int64_t pools = esz * (int64_t(c.num_layers) * kv + int64_t(c.num_sparse_layers()) * ik);
  const int64_t staging = o.fp8_kv ? 2 * (kv + (c.num_sparse_layers() > 0 ? ik : 0)) : 0;  // one layer, bf16
  return pools + staging;
}

int64_t CudaExecutor::page_bytes() const { return page_bytes_for(impl_->c, impl_->opt); }

CudaExecutor::~CudaExecutor() = default;

bool CudaExecutor::available() { return cuda::device_count() > 0; }

const M3Config& CudaExecutor::config() const { return impl_->c; }
PagePool& CudaExecutor::pool() { return *impl_->pool; }

std::vector<std::vector<float>> CudaExecutor::forward(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  return impl_->forward(seqs, trace);
}

// ---- decode through CUDA graphs ---------------------------------------------------------------------------------

const std::vector<int>& CudaExecutor::Impl::buckets() {
  // Batch sizes a decode graph is captured for (as vLLM's capture sizes): fine steps where padding costs most.
  static const std::vector<int> b = [] {
    std::vector<int> v{1, 2, 4, 8};
    for (int n = 16; n <= 64; n += 8) v.push_back(n);
    for (int n = 80; n <= 128; n += 16) v.push_back(n);
    for (int n = 160; n <= 512; n += 32) v.push_back(n);
    return v;
  }();
  return b;
}

int CudaExecutor::Impl::bucket_for(size_t n) const {
  for (int b : buckets())
    if (size_t(b) >= n) return b <= opt.max_graph_batch ? b : 0;
  return 0;
}

bool CudaExecutor::Impl::graph_eligible(std::span<const SeqInput> seqs, std::span<const RowSampling> rows) const {
  if (!opt.cuda_graphs || kv_type == cuda::KvType::F32 || wt != cuda::WType::BF16) return false;
  if (opt.attention == AttentionBackend::MsaV1 || opt.validate) return false;
  const int64_t G = c.num_q_heads / c.num_kv_heads, K = c.sparse_topk_blocks;
  if (c.head_dim != 128 || c.sparse_block_size != 128 || (G != 8 && G != 16)) return false;
  const bool sparse = opt.attention != AttentionBackend::Dense && c.num_sparse_layers() > 0;
  if (sparse && (c.index_head_dim != 128 || c.index_num_heads > cuda::MsaDecodeIndex::kMaxHeads ||
                 K > cuda::MsaDecodeIndex::kMaxTopK || K < 2))
    return false;
  if (bucket_for(seqs.size()) == 0) return false;
  for (const SeqInput& q : seqs)
    if (q.tokens.size() != 1 || q.all_logits || !q.media_embeds.empty() ||
        q.start_pos / c.sparse_block_size + 1 > graph_page_cap)
      return false;
  for (const RowSampling& r : rows)  // the logprob rows' raw copy is sized on demand: those steps run eagerly
    if (r.params && r.params->top_logprobs >= 0) return false;
  return true;
}

void CudaExecutor::Impl::drop_graphs() {
  for (auto& [b, g] : graphs)
    if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
}

bool CudaExecutor::Impl::capture(DecodeGraph& g, const StepRows& r) {
  if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
  prof.flush();  // the eager step's events are complete (it synchronised); nothing may wait inside the capture
  const uint64_t epoch = cuda::alloc_epoch();
  cudaGraph_t graph = nullptr;
  M3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  std::string why;
  try {
    enqueue_forward(r, nullptr, true);
    sampler.launch(logits.get(), stream);
    prof.mark(GpuStepProfile::kSampling, stream);
  } catch (const std::exception& e) {
    ok = false, why = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  g.prof_cats = prof.take_recorded();  // the capture executed nothing: its events are the graph's
  if (ok && end != cudaSuccess) ok = false, why = cudaGetErrorString(end);
  if (ok && cuda::alloc_epoch() != epoch) ok = false, why = "a buffer was allocated while capturing";
  if (ok) {
    const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
    if (inst != cudaSuccess) ok = false, why = cudaGetErrorString(inst), g.exec = nullptr;
  }
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture leaves a sticky launch error on some paths; the step itself succeeded
  if (!ok) {
    g.failed = true;
    ++graph_stats.capture_failures;
    spdlog::warn("CUDA executor: decode graph capture failed ({}); this batch size stays eager", why);
    return false;
  }
  g.epoch = epoch;
  ++graph_stats.captures;
  return true;
}

std::vector<SampledToken> CudaExecutor::Impl::decode_graph_step(std::span<const SeqInput> seqs,
                                                                 std::span<const RowSampling> rows,
                                                                 const std::function<void()>& before_sampling) {
  const size_t S = seqs.size();
  const int bucket = bucket_for(S);
  // Padding: sequences of one token (id 0) at position 0 whose page table is the scratch page.
  std::vector<SeqInput> padded(seqs.begin(), seqs.end());
  std::vector<RowSampling> prow(rows.begin(), rows.end());
  static const int32_t zero_token = 0;
  const int32_t scratch = scratch_page;
  for (size_t i = S; i < size_t(bucket); ++i) {
    SeqInput q;
    q.tokens = std::span<const int32_t>(&zero_token, 1);
    q.start_pos = 0;
    q.page_table = std::span<const int32_t>(&scratch, 1);
    padded.push_back(q);
    prow.emplace_back();  // no params: no token
  }
  const StepRows r = StepRows::build(c, padded, pool->capacity() + 1);  // the scratch page is a valid id here
  std::vector<int32_t> logit_rows(static_cast<size_t>(bucket));
  for (int i = 0; i < bucket; ++i) logit_rows[size_t(i)] = i;
  upload_step(r);
  // The graph holds the forward and the sampler's kernels, so the rows (grammar masks included) are staged before
  // it runs: no overlap of the mask work with the forward on this path (the eager path overlaps).
  if (before_sampling) before_sampling();
  stage_device_sampling(sampler, int(c.vocab_size), prow, logit_rows, stream);

  auto it = std::find_if(graphs.begin(), graphs.end(), [&](const auto& e) { return e.first == bucket; });
  if (it == graphs.end()) it = graphs.insert(graphs.end(), {bucket, DecodeGraph{}});
  DecodeGraph& g = it->second;
  if (g.exec && g.epoch != cuda::alloc_epoch()) {  // something moved: every graph is stale
    drop_graphs();
    ++graph_stats.invalidations;
  }
  std::vector<SampledToken> out;
  if (g.exec) {
    prof.replay(true, g.prof_cats);
    M3_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    ++graph_stats.replays;
    out = finish_device_sampling(sampler, prow, stream);
  } else {
    // This step runs eagerly in graph form (its tokens are the result), then the same launches are captured.
    enqueue_forward(r, nullptr, true);
    sampler.launch(logits.get(), stream);
    prof.mark(GpuStepProfile::kSampling, stream);
    out = finish_device_sampling(sampler, prow, stream);
    ++graph_stats.eager_graph_form;
    if (!g.failed && opt.capture_graphs) capture(g, r);
  }
  out.resize(S);
  return out;
}

GraphStats CudaExecutor::graph_stats() const { return impl_->graph_stats; }

std::vector<SampledToken> CudaExecutor::forward_sample(std::span<const SeqInput> seqs,
                                                       std::span<const RowSampling> rows,
                                                       const std::function<void()>& before_sampling) {
  M3_CHECK(rows.size() == seqs.size(), "forward_sample: {} sampling rows for {} sequences", rows.size(), seqs.size());
  Impl& m = *impl_;
  if (m.graph_eligible(seqs, rows)) {
    validate_step(m.c, seqs, m.pool->capacity());  // the real rows may not use the scratch page
    return m.decode_graph_step(seqs, rows, before_sampling);
  }
  ++m.graph_stats.eager_steps;
  const StepRows plan_rows = m.forward_device(seqs, nullptr);
  // Each sequence's last head row is the one it samples (all_logits sequences have one head row per token).
  std::vector<int32_t> logit_rows(seqs.size());
  int32_t at = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    at += int32_t(seqs[si].all_logits ? plan_rows.seq_begin[si + 1] - plan_rows.seq_begin[si] : 1);
    logit_rows[si] = at - 1;
  }
  if (before_sampling) before_sampling();  // host work (grammar masks) while the device runs the forward
  enqueue_device_sampling(m.sampler, m.logits.get(), int(m.c.vocab_size), rows, logit_rows, m.stream);
  m.prof.mark(GpuStepProfile::kSampling, m.stream);
  return finish_device_sampling(m.sampler, rows, m.stream);  // the step's one sync: ids (+ logprobs) to the host
}

std::string CudaExecutor::describe() const {
  const Impl& m = *impl_;
  cudaDeviceProp prop{};
  std::string name = "?";
  if (cudaGetDeviceProperties(&prop, m.opt.device) == cudaSuccess) name = prop.name;
  const double mib = double(page_bytes()) * m.pool->capacity() / (1 << 20);
  const char* kv_name = m.kv_type == cuda::KvType::E4M3   ? "fp8 e4m3"
                        : m.kv_type == cuda::KvType::BF16 ? "bf16"
                                                          : "fp32";
  // FP8 KV: what the same bytes would hold as a bf16 cache (the capacity change of --kv-cache-dtype fp8).
  std::string fp8_note;
  if (m.kv_type == cuda::KvType::E4M3) {
    CudaExecutorOptions bf = m.opt;
    bf.fp8_kv = false;
    const int64_t bf_pages = int64_t(double(page_bytes()) * m.pool->capacity() / double(page_bytes_for(m.c, bf)));
    const double stage_mib = double(m.stage_k.size() + m.stage_v.size() + m.stage_ik.size()) / (1 << 20);
    fp8_note = fmt::format(" [e4m3 with per-tensor scales, bf16 prefill staging {:.1f} MiB included; a bf16 cache "
                           "in the same memory: {} tokens]",
                           stage_mib, bf_pages * m.c.sparse_block_size);
  }
  const char* attn = m.opt.attention == AttentionBackend::Dense ? "dense" : m.opt.attention == AttentionBackend::MsaV1 ? "msa-v1" : "msa";
  const std::string wname =
      m.fp8_count > 0
          ? fmt::format("fp8 ({} matrices e4m3 {}, {}) + bf16", m.fp8_count, fp8_scale_name(kFp8Fmt),
                        m.opt.fp8_lt_min_rows > 0
                            ? fmt::format("W8A16 below {} rows, else cuBLASLt FP8", m.opt.fp8_lt_min_rows)
                            : std::string("W8A16 only"))
          : m.wt == cuda::WType::BF16 ? std::string("bf16") : std::string("fp32");
  return fmt::format("cuda {} ({} weights, {} KV, attention {}, {} layers, weights {}, decode graphs {}), KV cache {} "
                     "pages × {} tokens = {} tokens ({:.1f} MiB){}", name,
                     wname, kv_name, attn, m.c.num_layers,
                     m.weights_source,
                     m.opt.cuda_graphs ? fmt::format("≤ {} sequences", m.opt.max_graph_batch) : std::string("off"),
                     m.pool->capacity(),
                     m.c.sparse_block_size,
                     int64_t(m.pool->capacity()) * m.c.sparse_block_size, mib, fp8_note);
}

}  // namespace m3
