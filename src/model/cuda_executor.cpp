// CudaExecutor: mirrors M3Model::forward (model/m3_model.cpp) op for op on the GPU.
//   per step (plan):  rows (positions, sequence ids, cache slots, page-table CSR) uploaded once; dense page lists,
//                     MSA page-list offsets and indexer tiles planned once and shared by all layers.
//   per layer (run):  norm → QKV GEMM → fused q/k norm + RoPE + cache write → [index GEMM → fused index norm + RoPE +
//                     index-K write → block scores → top-k → sparse attention] or dense attention → O GEMM (+= x)
//                     → norm → MLP or MoE (+= x).
#include "model/cuda_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"
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
#include "model/checkpoint.h"
#include "model/cuda_weight_loader.h"
#include "model/device_sampling.h"
#include "model/gpu_step_profile.h"

namespace m3 {

using cuda::DeviceBuffer;

namespace {

// A weight matrix on the device in the executor's weight type.
struct DevMat {
  DeviceBuffer<uint8_t> mem;
  cuda::WType wt = cuda::WType::F32;
  const void* get() const { return mem.get(); }
};

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
  cuda::WType wt;

  // Weights.
  DevMat embed, lm_head;
  DeviceBuffer<float> final_norm, inv_freq;
  std::vector<DevLayer> layers;

  // Cache (issue 9): per-layer pools, one page id addresses K, V and index-K of every layer (docs/KV_CACHE.md):
  //   K_l, V_l [P, Hkv, B, D] and IK_l [P, B, Di] (sparse layers only), elements of kv_type. A layer's slabs are
  //   contiguous (TMA, strided virtual-page views) and each pool could get its own dtype or shard later.
  struct LayerPools {
    DeviceBuffer<uint8_t> k, v, ik;
  };
  cuda::KvType kv_type = cuda::KvType::F32;
  std::vector<LayerPools> kvp;
  int64_t kv_page_elems = 0, ik_page_elems = 0;  // Hkv·B·D and B·Di

  // Step state.
  DeviceBuffer<int32_t> d_pos, d_row_seq, d_slot, d_pt_indptr, d_pt_pages, d_ids, d_head_rows, d_sel;
  DeviceBuffer<float> x, xn, qkv, q, attn, iqk, iq, scores, hsel, logits;
  DeviceBuffer<uint16_t> qb, iqb, attnb;  // bf16 copies for the tensor-core kernels: q, index q, attention output
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
  // The device storage of one weight slot (model/weight_plan.h), allocated on first use; what the streaming loader
  // and the dummy fill write into.
  DeviceSlot bind(const WeightSlot& s);
  ~Impl() {
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
  // The forward up to the LM head: logits [head rows, V] stay in `logits` on the device (forward() copies them out,
  // forward_sample() samples them there).
  StepRows forward_device(std::span<const SeqInput> seqs, ForwardTrace* trace);
  cuda::DeviceSampler sampler;  // forward_sample: logits → ids on the device (backend/cuda/sampling.cuh)
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
  M3_CUDA_CHECK(cudaSetDevice(opt.device));
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm = std::make_unique<cuda::Gemm>();
  put_f32(inv_freq, cuda::rope_inv_freq(c.rotary_dim, c.rope_theta));
  layers.resize(size_t(c.num_layers));
}

void CudaExecutor::Impl::upload(const M3Weights& w) {
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

DeviceSlot CudaExecutor::Impl::bind(const WeightSlot& s) {
  const bool bf16 = s.matrix && wt == cuda::WType::BF16;
  const size_t esz = bf16 ? 2 : 4, n = size_t(s.numel());
  auto mat = [&](DevMat& m, size_t elems, size_t at) {
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
  // KV pools: bf16 with bf16 weights (serving), fp32 with fp32 weights (the exact verification path).
  const int64_t B = c.sparse_block_size, D = c.head_dim;
  kv_type = wt == cuda::WType::BF16 ? cuda::KvType::BF16 : cuda::KvType::F32;
  kv_page_elems = c.num_kv_heads * B * D;
  ik_page_elems = B * c.index_head_dim;
  const int64_t page_bytes = CudaExecutor::page_bytes_for(c, kv_type == cuda::KvType::BF16);
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
  const size_t esz = cuda::kv_elem_bytes(kv_type);
  // Initial contents. fp32 (verification): NaN poison (0xFF…), so a read of a slot nothing wrote shows up in the
  // logits — the v1 kernels never read past a row's last valid token. bf16 (serving): zeros, as vLLM does, because
  // the union-tile prefill (msa_prefill_tc.cu) loads whole pages by TMA and multiplies the masked probabilities
  // (exact zeros) by every V row of the page: those rows must be finite. Afterwards a slot only ever holds what the
  // model wrote, so the invariant lasts as pages are reused.
  const int fill = kv_type == cuda::KvType::BF16 ? 0 : 0xFF;
  kvp.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerPools& lp = kvp[size_t(l)];
    const size_t kv_bytes = size_t(num_pages) * size_t(kv_page_elems) * esz;
    lp.k.grow(kv_bytes);
    lp.v.grow(kv_bytes);
    M3_CUDA_CHECK(cudaMemset(lp.k.get(), fill, kv_bytes));
    M3_CUDA_CHECK(cudaMemset(lp.v.get(), fill, kv_bytes));
    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const size_t ik_bytes = size_t(num_pages) * size_t(ik_page_elems) * esz;
      lp.ik.grow(ik_bytes);
      M3_CUDA_CHECK(cudaMemset(lp.ik.get(), fill, ik_bytes));
    }
  }
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

StepRows CudaExecutor::Impl::forward_device(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_q_heads, Hkv = c.num_kv_heads;
  const int64_t B = c.sparse_block_size, V = c.vocab_size, G = Hq / Hkv;
  cudaStream_t s = stream;
  M3_CHECK(!seqs.empty(), "forward: no sequences");

  // ---- plan: rows of the step (model/step_plan.h, shared with the CPU forward) ------------------------------
  const StepRows plan_rows = StepRows::build(c, seqs, pool->capacity());
  const std::vector<int32_t>& pos = plan_rows.pos;
  const std::vector<int32_t>& row_seq = plan_rows.row_seq;
  const std::vector<int32_t>& slot = plan_rows.slot;
  const std::vector<int32_t>& pt_indptr = plan_rows.pt_indptr;
  const std::vector<int32_t>& pt_pages = plan_rows.pt_pages;
  const std::vector<int32_t>& ids = plan_rows.ids;
  const std::vector<int64_t>& seq_begin = plan_rows.seq_begin;
  const int max_n = plan_rows.max_new_tokens;
  const int64_t T = plan_rows.num_rows();
  cuda::upload(d_pos, pos.data(), pos.size(), s);
  cuda::upload(d_row_seq, row_seq.data(), row_seq.size(), s);
  cuda::upload(d_slot, slot.data(), slot.size(), s);
  cuda::upload(d_pt_indptr, pt_indptr.data(), pt_indptr.size(), s);
  cuda::upload(d_pt_pages, pt_pages.data(), pt_pages.size(), s);
  cuda::upload(d_ids, ids.data(), ids.size(), s);
  const cuda::DevStepRows rows{d_pos.get(), d_row_seq.get(), d_pt_indptr.get(), d_pt_pages.get(), int(T)};
  const bool decode = max_n <= 16;  // decode / speculative verify rows: split-K and the decode indexer launch
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
  const bool tc = opt.attention != AttentionBackend::MsaV1 && kv_type == cuda::KvType::BF16 && D == 128 && B == 128;
  const bool tc_decode = tc && decode && (G == 8 || G == 16) && T <= cuda::MsaDecodeIndex::kMaxRows;
  const bool tc_index = tc_decode && any_sparse && Di == 128 && Hi <= cuda::MsaDecodeIndex::kMaxHeads &&
                        K <= cuda::MsaDecodeIndex::kMaxTopK;
  const bool tc_prefill = tc && !decode && any_sparse && G == 16 && K <= 16;
  const bool tc_dense_prefill = tc && !decode && any_dense && G == 16;  // union kernel in dense causal mode
  const bool tc_prefill_index =  // MsaIndexerTc::run_topk
      tc_prefill && Di == 128 && Hi >= 1 && 128 % Hi == 0 && K <= cuda::MsaIndexerTc::kMaxTopK;
  if (tc_dense_prefill) msa_union.plan(T, int(Hkv), int(G), int(D), int(B), 16);
  if (tc_prefill) msa_sparse.plan(T, int(Hkv), int(G), int(D), int(B), int(K), int64_t(pool->capacity()));
  if (any_dense && !tc_dense_prefill) {
    dense.plan(pos, rows, int(Hkv), int(G), int(D), int(B), ppu, decode, s);
    if (tc_decode) dense_tc.plan(int(T * Hkv), int(G), dense.max_pages(), true);
  }
  if (any_sparse) {
    if (tc_index) {
      dec_index.plan(pos, rows, int(Hi), int(K), ppu, s);
      sparse_tc.plan(int(T * Hkv), int(G), dec_index.max_pages(), true);
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
  if (tc_decode) attnb.grow(size_t(T * Hq * D));
  const int64_t qkv_w = (Hq + 2 * Hkv) * D;
  x.grow(size_t(T * H));
  xn.grow(size_t(T * H));
  qkv.grow(size_t(T * qkv_w));
  q.grow(size_t(T * Hq * D));
  attn.grow(size_t(T * Hq * D));
  if (trace) {
    trace->hidden.assign(trace->capture_hidden ? c.num_layers : 0, {});
    trace->selection.assign(c.num_layers, {});
    trace->block_scores.assign(c.num_layers, {});
    trace->block_scores_cols.assign(seqs.size(), 0);
  }

  cuda::embed_rows(embed.get(), wt == cuda::WType::BF16, H, d_ids.get(), T, x.get(), s);
  prof.mark(GpuStepProfile::kEmbedNorm, s);  // with the plans' small kernels and uploads
  const float scale = 1.0f / std::sqrt(float(D));
  for (int l = 0; l < c.num_layers; ++l) {
    DevLayer& L = layers[l];
    const cuda::DevPagedKV kv = kv_view(l);
    // ---- attention -------------------------------------------------------------------------------------------
    cuda::rms_norm_gemma(x.get(), T, H, L.input_norm.get(), c.rms_norm_eps, xn.get(), s);
    prof.mark(GpuStepProfile::kEmbedNorm, s);
    gemm->nt(xn.get(), T, H, L.wqkv.get(), wt, qkv_w, qkv.get(), false, s);
    prof.mark(GpuStepProfile::kGemm, s);
    cuda::HeadsNormRopeArgs a;
    a.src = qkv.get(), a.src_ld = qkv_w, a.T = int(T), a.D = int(D);
    a.n_q = int(Hq), a.q_col0 = 0, a.q_w = L.q_norm.get(), a.q_out = q.get();
    a.n_k = int(Hkv), a.k_col0 = int(Hq * D), a.k_w = L.k_norm.get(), a.k_cache = kv.k, a.k_head_stride = B * D;
    a.n_v = int(Hkv), a.v_col0 = int((Hq + Hkv) * D), a.v_cache = kv.v, a.v_head_stride = B * D;
    a.cache_type = kv.type;
    a.pos = d_pos.get(), a.slot_page = d_slot.get(), a.page_stride = kv.page_stride, a.block_size = int(B);
    a.inv_freq = inv_freq.get(), a.rotary_dim = c.rotary_dim, a.eps = c.rms_norm_eps;
    cuda::heads_norm_rope(a, s);
    prof.mark(GpuStepProfile::kAttention, s);  // q/k norm, RoPE and the K/V cache write

    bool o_bf16 = false;  // the attention output is in attnb (bf16) instead of attn
    if (c.attn_kinds[l] == AttnKind::Sparse && !dense_only) {
      const int64_t iw = (Hi + 1) * Di;
      gemm->nt(xn.get(), T, H, L.w_index_qk.get(), wt, iw, iqk.get(), false, s);
      cuda::HeadsNormRopeArgs b;
      b.src = iqk.get(), b.src_ld = iw, b.T = int(T), b.D = int(Di);
      b.n_q = int(Hi), b.q_col0 = 0, b.q_w = L.index_q_norm.get(), b.q_out = iq.get();
      const cuda::DevPagedIndexK ikv = ik_view(l);
      b.n_k = 1, b.k_col0 = int(Hi * Di), b.k_w = L.index_k_norm.get(), b.k_cache = ikv.ik, b.k_head_stride = 0;
      b.cache_type = ikv.type;
      b.pos = d_pos.get(), b.slot_page = d_slot.get(), b.page_stride = ikv.page_stride, b.block_size = int(B);
      b.inv_freq = inv_freq.get(), b.rotary_dim = c.rotary_dim, b.eps = c.rms_norm_eps;
      cuda::heads_norm_rope(b, s);
      prof.mark(GpuStepProfile::kIndexer, s);  // index projection, norm, RoPE, index-K write
      const int32_t* sel = d_sel.get();  // [Hi, T, K]
      if (tc_index) {
        // Fused scorer + top-k + page-list emit, then the tensor-core paged decode over the emitted lists.
        cuda::f32_to_bf16(iq.get(), T * Hi * Di, iqb.get(), s);
        dec_index.run(reinterpret_cast<const __nv_bfloat16*>(iqb.get()),
                      cuda::DevPagedIndexKT<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(ikv.ik), ikv.page_stride},
                      rows, s);
        sel = dec_index.selection();
        prof.mark(GpuStepProfile::kIndexer, s);
        cuda::f32_to_bf16(q.get(), T * Hq * D, qb.get(), s);
        cuda::PagedDecodeTcArgs<__nv_bfloat16> pa;
        pa.q = reinterpret_cast<const __nv_bfloat16*>(qb.get());
        pa.out = reinterpret_cast<__nv_bfloat16*>(attnb.get());
        pa.k = static_cast<const __nv_bfloat16*>(kv.k), pa.v = static_cast<const __nv_bfloat16*>(kv.v);
        pa.stride_page = B * D, pa.stride_tok = D;
        pa.indptr = dec_index.attn_indptr(), pa.indices = dec_index.attn_indices();
        pa.last_len = dec_index.attn_last_len();
        pa.R = int(T * Hkv), pa.G = int(G), pa.scale = scale;
        sparse_tc.run(pa, s);
        prof.mark(GpuStepProfile::kAttention, s);
        o_bf16 = true;
      } else {
        if (tc_prefill_index) {  // scores + top-k fused: no score matrix (msa_indexer_tc.cuh)
          cuda::f32_to_bf16(iq.get(), T * Hi * Di, iqb.get(), s);
          indexer_tc.run_topk(iqb.get(), static_cast<const uint16_t*>(ikv.ik), ikv.page_stride,
                              int64_t(pool->capacity()), rows, int(K), d_sel.get(), s);
        } else {
          indexer.run(iq.get(), ikv, rows, scores.get(), s);
          cuda::msa_topk(scores.get(), int(T), int(Hi), d_pos.get(), int(B), indexer.max_cols(), int(K), d_sel.get(),
                         s);
        }
        prof.mark(GpuStepProfile::kIndexer, s);
        if (tc_prefill) {
          cuda::f32_to_bf16(q.get(), T * Hq * D, qb.get(), s);
          const cuda::DevPagedKVBf16 kvb{static_cast<const uint16_t*>(kv.k), static_cast<const uint16_t*>(kv.v),
                                         kv.page_stride, int64_t(pool->capacity()), int(Hkv), int(B), int(D)};
          msa_sparse.run(qb.get(), d_sel.get(), rows, kvb, scale, attn.get(), s);
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
        for (size_t si = 0; si < seqs.size(); ++si) {
          const int64_t t0 = seq_begin[si], n = seq_begin[si + 1] - t0;
          std::vector<int32_t> one(size_t(Hi * n * K));
          for (int64_t h = 0; h < Hi; ++h)
            std::memcpy(&one[size_t(h * n * K)], &all[size_t((h * T + t0) * K)], size_t(n * K) * 4);
          trace->selection[l].push_back(std::move(one));
        }
      }
    } else if (tc_decode) {
      cuda::f32_to_bf16(q.get(), T * Hq * D, qb.get(), s);
      cuda::PagedDecodeTcArgs<__nv_bfloat16> pa;
      pa.q = reinterpret_cast<const __nv_bfloat16*>(qb.get());
      pa.out = reinterpret_cast<__nv_bfloat16*>(attnb.get());
      pa.k = static_cast<const __nv_bfloat16*>(kv.k), pa.v = static_cast<const __nv_bfloat16*>(kv.v);
      pa.stride_page = B * D, pa.stride_tok = D;
      pa.indptr = dense.indptr(), pa.indices = dense.indices(), pa.last_len = dense.last_len();
      pa.R = int(T * Hkv), pa.G = int(G), pa.scale = scale;
      dense_tc.run(pa, s);
      o_bf16 = true;
    } else if (tc_dense_prefill) {
      cuda::f32_to_bf16(q.get(), T * Hq * D, qb.get(), s);
      const cuda::DevPagedKVBf16 kvb{static_cast<const uint16_t*>(kv.k), static_cast<const uint16_t*>(kv.v),
                                     kv.page_stride, int64_t(pool->capacity()), int(Hkv), int(B), int(D)};
      msa_union.run_dense(qb.get(), rows, kvb, scale, attn.get(), s);
    } else {
      dense.run(q.get(), kv, scale, attn.get(), s);
    }
    prof.mark(GpuStepProfile::kAttention, s);
    if (o_bf16)
      gemm->nt_bf16(attnb.get(), T, Hq * D, L.wo.get(), H, x.get(), true, s);  // x += o
    else
      gemm->nt(attn.get(), T, Hq * D, L.wo.get(), wt, H, x.get(), true, s);  // x += o
    prof.mark(GpuStepProfile::kGemm, s);

    // ---- feed-forward ------------------------------------------------------------------------------------------
    cuda::rms_norm_gemma(x.get(), T, H, L.post_attn_norm.get(), c.rms_norm_eps, xn.get(), s);
    prof.mark(GpuStepProfile::kEmbedNorm, s);
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      const cuda::MlpDev m{L.mlp.gate_up.get(), L.mlp.down.get(), wt, L.mlp.I};
      cuda::run_mlp(*gemm, m, xn.get(), T, H, c.swiglu_alpha, c.swiglu_limit, x.get(), true, ffn, s);
      prof.mark(GpuStepProfile::kMlp, s);
    } else {
      cuda::MoeArgs m;
      m.router = L.router.get();
      m.router_bias = L.router_bias.size() ? L.router_bias.get() : nullptr;
      const int64_t E = c.num_experts, I = L.expert_I;
      const size_t esz = wt == cuda::WType::BF16 ? 2 : 4;
      for (int64_t e = 0; e < E; ++e)
        m.experts.push_back(cuda::MlpDev{L.experts_gate_up.mem.get() + size_t(e * 2 * I * H) * esz,
                                         L.experts_down.mem.get() + size_t(e * H * I) * esz, wt, I});
      if (L.shared.I > 0) m.shared = cuda::MlpDev{L.shared.gate_up.get(), L.shared.down.get(), wt, L.shared.I};
      if (wt == cuda::WType::BF16)  // the grouped device path (no host sync); fp32 keeps the exact sync path
        m.stacked_gate_up = L.experts_gate_up.mem.get(), m.stacked_down = L.experts_down.mem.get(), m.expert_I = I;
      m.E = E, m.top_k = c.num_experts_per_tok, m.routed_scale = c.routed_scaling_factor;
      m.alpha = c.swiglu_alpha, m.limit = c.swiglu_limit;
      cuda::moe_forward(*gemm, m, xn.get(), T, H, x.get(), ffn, s);
      prof.mark(GpuStepProfile::kMoe, s);
    }
    if (trace && trace->capture_hidden) {
      trace->hidden[l].resize(size_t(T * H));
      M3_CUDA_CHECK(cudaMemcpyAsync(trace->hidden[l].data(), x.get(), size_t(T * H) * 4, cudaMemcpyDeviceToHost, s));
      M3_CUDA_CHECK(cudaStreamSynchronize(s));
    }
  }

  // ---- head: final norm + LM head on the rows that need logits ---------------------------------------------------
  const std::vector<int32_t>& head_rows = plan_rows.head_rows;
  const int64_t HR = int64_t(head_rows.size());
  cuda::upload(d_head_rows, head_rows.data(), head_rows.size(), s);
  hsel.grow(size_t(HR * H));
  logits.grow(size_t(HR * V));
  cuda::gather_rows(x.get(), H, d_head_rows.get(), HR, hsel.get(), s);
  cuda::rms_norm_gemma(hsel.get(), HR, H, final_norm.get(), c.rms_norm_eps, hsel.get(), s);
  gemm->nt(hsel.get(), HR, H, lm_head.get(), wt, V, logits.get(), false, s);
  prof.mark(GpuStepProfile::kHead, s);
  return plan_rows;
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
  m.load_stats = stream_weights_to_device(st, weight_plan(cfg), [&m](const WeightSlot& s) { return m.bind(s); },
                                          m.stream, stream);
  m.weights_source = "safetensors, streamed";
  m.alloc_kv(num_pages);
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

std::unique_ptr<CudaExecutor> CudaExecutor::dummy(const M3Config& cfg, uint64_t seed, int32_t num_pages,
                                                  CudaExecutorOptions opt) {
  auto impl = std::make_unique<Impl>(cfg, opt);
  Impl& m = *impl;
  m.load_stats = fill_dummy_weights(weight_plan(cfg), [&m](const WeightSlot& s) { return m.bind(s); }, seed, m.stream);
  m.weights_source = "dummy";
  m.alloc_kv(num_pages);
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

const LoadStats& CudaExecutor::load_stats() const { return impl_->load_stats; }

std::vector<uint8_t> CudaExecutor::weight_bytes(const WeightSlot& s) const {
  const DeviceSlot d = impl_->bind(s);
  std::vector<uint8_t> out(size_t(s.numel()) * (d.bf16 ? 2 : 4));
  M3_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  M3_CUDA_CHECK(cudaMemcpy(out.data(), d.ptr, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

int64_t CudaExecutor::page_bytes_for(const M3Config& c, bool bf16_kv) {
  const int64_t B = c.sparse_block_size, esz = bf16_kv ? 2 : 4;
  return esz * (int64_t(c.num_layers) * 2 * c.num_kv_heads * B * c.head_dim +
                int64_t(c.num_sparse_layers()) * B * c.index_head_dim);
}

int64_t CudaExecutor::page_bytes() const {
  return page_bytes_for(impl_->c, impl_->kv_type == cuda::KvType::BF16);
}

CudaExecutor::~CudaExecutor() = default;

bool CudaExecutor::available() { return cuda::device_count() > 0; }

const M3Config& CudaExecutor::config() const { return impl_->c; }
PagePool& CudaExecutor::pool() { return *impl_->pool; }

std::vector<std::vector<float>> CudaExecutor::forward(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  return impl_->forward(seqs, trace);
}

std::vector<SampledToken> CudaExecutor::forward_sample(std::span<const SeqInput> seqs,
                                                       std::span<const RowSampling> rows) {
  M3_CHECK(rows.size() == seqs.size(), "forward_sample: {} sampling rows for {} sequences", rows.size(), seqs.size());
  Impl& m = *impl_;
  const StepRows plan_rows = m.forward_device(seqs, nullptr);
  // Each sequence's last head row is the one it samples (all_logits sequences have one head row per token).
  std::vector<int32_t> logit_rows(seqs.size());
  int32_t at = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    at += int32_t(seqs[si].all_logits ? plan_rows.seq_begin[si + 1] - plan_rows.seq_begin[si] : 1);
    logit_rows[si] = at - 1;
  }
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
  const bool bf16_kv = m.kv_type == cuda::KvType::BF16;
  const char* attn = m.opt.attention == AttentionBackend::Dense ? "dense" : m.opt.attention == AttentionBackend::MsaV1 ? "msa-v1" : "msa";
  return fmt::format("cuda {} ({} weights, {} KV, attention {}, {} layers, weights {}), KV cache {} pages × {} tokens "
                     "= {} tokens ({:.1f} MiB)", name,
                     m.wt == cuda::WType::BF16 ? "bf16" : "fp32", bf16_kv ? "bf16" : "fp32", attn, m.c.num_layers,
                     m.weights_source, m.pool->capacity(),
                     m.c.sparse_block_size,
                     int64_t(m.pool->capacity()) * m.c.sparse_block_size, mib);
}

}  // namespace m3
