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

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/mlp_moe.cuh"
#include "backend/cuda/msa_decode.cuh"
#include "backend/cuda/msa_indexer.cuh"
#include "backend/cuda/msa_prefill.cuh"
#include "backend/cuda/msa_topk.cuh"
#include "backend/cuda/norm_rope.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "model/checkpoint.h"

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

  // Cache: num_pages units of unit_floats; per-layer offsets inside a unit as in KVCache.
  DeviceBuffer<float> cache;
  int64_t unit_floats = 0;
  std::vector<int64_t> k_off, v_off, ik_off;

  // Step state.
  DeviceBuffer<int32_t> d_pos, d_row_seq, d_slot, d_pt_indptr, d_pt_pages, d_ids, d_head_rows, d_sel;
  DeviceBuffer<float> x, xn, qkv, q, attn, iqk, iq, scores, hsel, logits;
  cuda::FfnScratch ffn;
  cuda::DenseAttention dense;
  cuda::MsaPrefill msa_prefill;
  cuda::MsaDecode msa_decode;
  cuda::MsaIndexer indexer;

  Impl(const M3Config& cfg, const M3Weights& w, int32_t num_pages, CudaExecutorOptions o);
  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
  }
  cuda::DevPagedKV kv_view(int l) {
    return cuda::DevPagedKV{cache.get() + k_off[l], cache.get() + v_off[l], unit_floats, c.num_kv_heads,
                            c.sparse_block_size, c.head_dim};
  }
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace);
};

CudaExecutor::Impl::Impl(const M3Config& cfg, const M3Weights& w, int32_t num_pages, CudaExecutorOptions o)
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
  const int64_t H = c.hidden_size;
  put(embed, w.embed.data(), w.embed.size(), wt);
  put(lm_head, w.lm_head.data(), w.lm_head.size(), wt);
  put_f32(final_norm, w.final_norm);
  put_f32(inv_freq, cuda::rope_inv_freq(c.rotary_dim, c.rope_theta));
  layers.resize(c.num_layers);
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
  // Page unit: the CPU layout, padded to a multiple of B·D floats (virtual-page view, attention_dense.cuh).
  const int64_t B = c.sparse_block_size, D = c.head_dim;
  {
    PageLayout layout = PageLayout::of(c, B * D);  // page_bytes_for()
    k_off = std::move(layout.k_off);
    v_off = std::move(layout.v_off);
    ik_off = std::move(layout.ik_off);
    unit_floats = layout.page_floats;
  }
  if (num_pages <= 0) {
    // Automatic size: 90 % of the free device memory minus 1 GiB of headroom for activations and workspaces, at
    // most 64 sequences of max_position_embeddings tokens.
    size_t free_b = 0, total_b = 0;
    M3_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double budget = std::max(0.0, 0.9 * double(free_b) - double(size_t(1) << 30));
    int64_t n = int64_t(budget / (double(unit_floats) * sizeof(float)));
    if (c.max_position_embeddings > 0) n = std::min<int64_t>(n, 64 * ((c.max_position_embeddings + B - 1) / B));
    n = std::min<int64_t>(n, int64_t(1) << 22);
    M3_CHECK(n >= 1, "CUDA executor: no device memory left for the KV cache ({} MiB free)", free_b >> 20);
    num_pages = int32_t(n);
  }
  pool = std::make_unique<PagePool>(num_pages);
  cache.grow(size_t(num_pages) * size_t(unit_floats));
  // NaN poison (0xFFFFFFFF is a NaN): a read of a slot nothing wrote shows up in the logits.
  M3_CUDA_CHECK(cudaMemset(cache.get(), 0xFF, size_t(num_pages) * size_t(unit_floats) * sizeof(float)));
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<std::vector<float>> CudaExecutor::Impl::forward(std::span<const SeqInput> seqs, ForwardTrace* trace) {
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
  const int64_t ppu = unit_floats / (B * D);
  const bool any_dense = std::count(c.attn_kinds.begin(), c.attn_kinds.end(), AttnKind::Dense) > 0;
  const bool any_sparse = c.num_sparse_layers() > 0;
  if (any_dense) dense.plan(pos, rows, int(Hkv), int(G), int(D), int(B), ppu, decode, s);
  const int64_t Hi = c.index_num_heads, Di = c.index_head_dim, K = c.sparse_topk_blocks;
  if (any_sparse) {
    if (decode)
      msa_decode.plan(pos, int(Hkv), int(G), int(D), int(B), int(K), true, s);
    else
      msa_prefill.plan(pos, int(Hkv), int(G), int(D), int(B), int(K), s);
    indexer.plan(pos, row_seq, int(Hi), int(B), decode, s);
    iqk.grow(size_t(T * (Hi + 1) * Di));
    iq.grow(size_t(T * Hi * Di));
    scores.grow(size_t(Hi * T * indexer.max_cols()));
    d_sel.grow(size_t(Hi * T * K));
  }
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
  const float scale = 1.0f / std::sqrt(float(D));
  for (int l = 0; l < c.num_layers; ++l) {
    DevLayer& L = layers[l];
    const cuda::DevPagedKV kv = kv_view(l);
    // ---- attention -------------------------------------------------------------------------------------------
    cuda::rms_norm_gemma(x.get(), T, H, L.input_norm.get(), c.rms_norm_eps, xn.get(), s);
    gemm->nt(xn.get(), T, H, L.wqkv.get(), wt, qkv_w, qkv.get(), false, s);
    cuda::HeadsNormRopeArgs a;
    a.src = qkv.get(), a.src_ld = qkv_w, a.T = int(T), a.D = int(D);
    a.n_q = int(Hq), a.q_col0 = 0, a.q_w = L.q_norm.get(), a.q_out = q.get();
    a.n_k = int(Hkv), a.k_col0 = int(Hq * D), a.k_w = L.k_norm.get(), a.k_cache = kv.k, a.k_head_stride = B * D;
    a.n_v = int(Hkv), a.v_col0 = int((Hq + Hkv) * D), a.v_cache = kv.v, a.v_head_stride = B * D;
    a.pos = d_pos.get(), a.slot_page = d_slot.get(), a.page_stride = unit_floats, a.block_size = int(B);
    a.inv_freq = inv_freq.get(), a.rotary_dim = c.rotary_dim, a.eps = c.rms_norm_eps;
    cuda::heads_norm_rope(a, s);

    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const int64_t iw = (Hi + 1) * Di;
      gemm->nt(xn.get(), T, H, L.w_index_qk.get(), wt, iw, iqk.get(), false, s);
      cuda::HeadsNormRopeArgs b;
      b.src = iqk.get(), b.src_ld = iw, b.T = int(T), b.D = int(Di);
      b.n_q = int(Hi), b.q_col0 = 0, b.q_w = L.index_q_norm.get(), b.q_out = iq.get();
      b.n_k = 1, b.k_col0 = int(Hi * Di), b.k_w = L.index_k_norm.get(), b.k_cache = cache.get() + ik_off[l];
      b.k_head_stride = 0;
      b.pos = d_pos.get(), b.slot_page = d_slot.get(), b.page_stride = unit_floats, b.block_size = int(B);
      b.inv_freq = inv_freq.get(), b.rotary_dim = c.rotary_dim, b.eps = c.rms_norm_eps;
      cuda::heads_norm_rope(b, s);
      const cuda::DevPagedIndexK ikv{cache.get() + ik_off[l], unit_floats, int(B), int(Di)};
      indexer.run(iq.get(), ikv, rows, scores.get(), s);
      cuda::msa_topk(scores.get(), int(T), int(Hi), d_pos.get(), int(B), indexer.max_cols(), int(K), d_sel.get(), s);
      if (decode) {
        msa_decode.run(q.get(), d_sel.get(), rows, kv, scale, attn.get(), s);
        if (opt.validate) msa_decode.check(s);
      } else {
        msa_prefill.run(q.get(), d_sel.get(), rows, kv, scale, attn.get(), s);
        if (opt.validate) msa_prefill.check(s);
      }
      if (trace && trace->capture_selection) {
        std::vector<int32_t> all(size_t(Hi * T * K));
        M3_CUDA_CHECK(cudaMemcpyAsync(all.data(), d_sel.get(), all.size() * 4, cudaMemcpyDeviceToHost, s));
        M3_CUDA_CHECK(cudaStreamSynchronize(s));
        for (size_t si = 0; si < seqs.size(); ++si) {
          const int64_t t0 = seq_begin[si], n = seq_begin[si + 1] - t0;
          std::vector<int32_t> sel(size_t(Hi * n * K));
          for (int64_t h = 0; h < Hi; ++h)
            std::memcpy(&sel[size_t(h * n * K)], &all[size_t((h * T + t0) * K)], size_t(n * K) * 4);
          trace->selection[l].push_back(std::move(sel));
        }
      }
    } else {
      dense.run(q.get(), kv, scale, attn.get(), s);
    }
    gemm->nt(attn.get(), T, Hq * D, L.wo.get(), wt, H, x.get(), true, s);  // x += o

    // ---- feed-forward ------------------------------------------------------------------------------------------
    cuda::rms_norm_gemma(x.get(), T, H, L.post_attn_norm.get(), c.rms_norm_eps, xn.get(), s);
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      const cuda::MlpDev m{L.mlp.gate_up.get(), L.mlp.down.get(), wt, L.mlp.I};
      cuda::run_mlp(*gemm, m, xn.get(), T, H, c.swiglu_alpha, c.swiglu_limit, x.get(), true, ffn, s);
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
      m.E = E, m.top_k = c.num_experts_per_tok, m.routed_scale = c.routed_scaling_factor;
      m.alpha = c.swiglu_alpha, m.limit = c.swiglu_limit;
      cuda::moe_forward(*gemm, m, xn.get(), T, H, x.get(), ffn, s);
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
  std::vector<float> all(size_t(HR * V));
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

std::unique_ptr<CudaExecutor> CudaExecutor::load(const std::string& model_dir, int32_t num_pages,
                                                 CudaExecutorOptions opt) {
  const Checkpoint ck = load_checkpoint(model_dir);
  return std::make_unique<CudaExecutor>(ck.config, ck.weights, num_pages, opt);
}

int64_t CudaExecutor::page_bytes_for(const M3Config& c) {
  return PageLayout::of(c, int64_t(c.sparse_block_size) * c.head_dim).page_floats * int64_t(sizeof(float));
}

int64_t CudaExecutor::page_bytes() const { return impl_->unit_floats * int64_t(sizeof(float)); }

CudaExecutor::~CudaExecutor() = default;

bool CudaExecutor::available() { return cuda::device_count() > 0; }

const M3Config& CudaExecutor::config() const { return impl_->c; }
PagePool& CudaExecutor::pool() { return *impl_->pool; }

std::vector<std::vector<float>> CudaExecutor::forward(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  return impl_->forward(seqs, trace);
}

std::string CudaExecutor::describe() const {
  const Impl& m = *impl_;
  cudaDeviceProp prop{};
  std::string name = "?";
  if (cudaGetDeviceProperties(&prop, m.opt.device) == cudaSuccess) name = prop.name;
  const double mib = double(m.unit_floats) * 4.0 * m.pool->capacity() / (1 << 20);
  return fmt::format("cuda {} ({} weights, fp32 KV), KV cache {} pages × {} tokens = {} tokens ({:.1f} MiB)", name,
                     m.wt == cuda::WType::BF16 ? "bf16" : "fp32", m.pool->capacity(), m.c.sparse_block_size,
                     int64_t(m.pool->capacity()) * m.c.sparse_block_size, mib);
}

}  // namespace m3
