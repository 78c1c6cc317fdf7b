// bench_msa: smoke benchmark of the CUDA backend (issue 5) — docs/MSA_CONTRACT.md §5/§7 style.
//   ceilings: device-to-device copy (bytes read + written) and a bf16 8192³ cuBLASLt GEMM, measured here;
//   MSA sparse layer at M3 shapes (64/4/128, block 128, top-16, index 4×128): prefill of one 16,384-token chunk at
//   KV 16k and 64k, decode (Q = 1) for B = 8 and 64 at 16k and 64k: indexer, top-k and sparse attention, each with
//   its FLOPs and bytes and the floor they imply;
//   the tiny model's decode step (CudaExecutor, bf16 and fp32 weights) and the CPU reference's.
// Timing: CUDA events around each run() on the stream, 3 warm-ups, median of 21 (CV printed); plan() excluded.
// Eager launches (no CUDA graph yet) and no cold-cache rotation: every working set here is > 2× L2 except the
// tiny model's.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/msa_decode.cuh"
#include "backend/cuda/msa_indexer.cuh"
#include "backend/cuda/msa_prefill.cuh"
#include "backend/cuda/msa_topk.cuh"
#include "kv/sequence_kv.h"
#include "model/cuda_executor.h"
#include "model/m3_model.h"
#include "bench_common/event_timer.h"

namespace m3::bench {
void fill_uniform(float* p, int64_t n, uint64_t seed, float lo, float hi);
}

namespace {

using namespace m3;
using cuda::DeviceBuffer;

struct Stats {
  double median_ms = 0, cv = 0;
};

Stats time_events(const std::function<void()>& f, int warm = 3, int reps = 21) {
  const std::vector<float> t = m3::bench::time_sorted_ms(f, warm, reps);
  const double mean = std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
  double var = 0;
  for (double x : t) var += (x - mean) * (x - mean);
  return {t[t.size() / 2], std::sqrt(var / double(t.size())) / mean};
}

Stats time_host(const std::function<void()>& f, int warm = 3, int reps = 21) {
  for (int i = 0; i < warm; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  const double mean = std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
  double var = 0;
  for (double x : t) var += (x - mean) * (x - mean);
  return {t[t.size() / 2], std::sqrt(var / double(t.size())) / mean};
}

double g_bw = 4.3e12;        // bytes/s, replaced by the measured copy
double g_tc = 790e12;        // bf16 tensor-core FLOP/s, replaced by the measured GEMM
const double kSimt = 67e12;  // fp32 CUDA-core peak (H200 SXM datasheet) — what the v1 kernels run on

void row(const std::string& what, const std::string& op, Stats s, double flops, double bytes) {
  const double t = s.median_ms * 1e-3;
  const double f_tc = flops / g_tc, f_simt = flops / kSimt, f_bw = bytes / g_bw;
  const double floor_tc = std::max(f_tc, f_bw), floor_simt = std::max(f_simt, f_bw);
  std::printf("| %-30s | %-16s | %10.3f | %5.1f%% | %9.3f | %9.3f | %8.3f | %8.3f | %7.1f | %7.2f |\n", what.c_str(),
              op.c_str(), s.median_ms, 100 * s.cv, flops / 1e12, bytes / 1e9, floor_tc * 1e3, floor_simt * 1e3,
              flops > 0 ? flops / t / 1e12 : 0.0, bytes / t / 1e12);
}

void header() {
  std::printf("\n| case | op | median ms | CV | TFLOP | GB | floor ms (bf16 TC) | floor ms (fp32 SIMT) | TFLOP/s | TB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
}

// Shapes (TP1 M3).
constexpr int Hq = 64, Hkv = 4, D = 128, B = 128, K = 16, Hi = 4, Di = 128, G = Hq / Hkv;
constexpr int64_t kUnit = 2LL * Hkv * B * D + int64_t(B) * Di;  // one sparse layer's page unit (fp32)

struct Setup {
  DeviceBuffer<float> cache, q, iq, out, scores;
  DeviceBuffer<int32_t> pos, row_seq, indptr, pages, sel;
  std::vector<int32_t> h_pos, h_row, h_indptr, h_pages;
  cuda::DevStepRows rows() const { return {pos.get(), row_seq.get(), indptr.get(), pages.get(), int(h_pos.size())}; }
  cuda::DevPagedKV kv() const { return {cache.get(), cache.get() + int64_t(Hkv) * B * D, kUnit, Hkv, B, D}; }
  cuda::DevPagedIndexK ik() const { return {cache.get() + 2LL * Hkv * B * D, kUnit, B, Di}; }
};

// seqs: (context length L, query rows Q): rows are the last Q positions of each sequence.
void build(Setup& s, const std::vector<std::pair<int64_t, int>>& seqs, uint64_t seed) {
  int64_t pages = 1;
  for (auto [L, Q] : seqs) pages += (L + B - 1) / B;
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  s.h_indptr = {0};
  size_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto [L, Q] = seqs[i];
    for (int t = 0; t < Q; ++t) s.h_pos.push_back(int32_t(L - Q + t)), s.h_row.push_back(int32_t(i));
    const int64_t n = (L + B - 1) / B;
    s.h_pages.insert(s.h_pages.end(), perm.begin() + int64_t(next), perm.begin() + int64_t(next) + n);
    next += static_cast<size_t>(n);
    s.h_indptr.push_back(int32_t(s.h_pages.size()));
  }
  const int64_t T = int64_t(s.h_pos.size());
  s.cache.grow(static_cast<size_t>(pages * kUnit));
  bench::fill_uniform(s.cache.get(), pages * kUnit, seed, 0.01f, 1.f);
  s.q.grow(static_cast<size_t>(T * Hq * D));
  bench::fill_uniform(s.q.get(), T * Hq * D, seed + 1, 0.01f, 1.f);
  s.iq.grow(static_cast<size_t>(T * Hi * Di));
  bench::fill_uniform(s.iq.get(), T * Hi * Di, seed + 2, 0.01f, 1.f);
  s.out.grow(static_cast<size_t>(T * Hq * D));
  s.sel.grow(static_cast<size_t>(Hi * T * K));
  cuda::upload(s.pos, s.h_pos.data(), s.h_pos.size(), nullptr);
  cuda::upload(s.row_seq, s.h_row.data(), s.h_row.size(), nullptr);
  cuda::upload(s.indptr, s.h_indptr.data(), s.h_indptr.size(), nullptr);
  cuda::upload(s.pages, s.h_pages.data(), s.h_pages.size(), nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

struct Counts {
  double idx_flops = 0, idx_bytes = 0, topk_bytes = 0, attn_flops = 0, attn_bytes = 0;
};

Counts count(const Setup& s, int64_t cols, int64_t unique_kv_tokens) {
  Counts c;
  const int64_t T = int64_t(s.h_pos.size());
  double hist = 0, sel_tokens = 0;
  for (int32_t p : s.h_pos) {
    hist += double(p / B) * B;
    sel_tokens += double(std::min(K, p / B + 1) - 1) * B + p % B + 1;
  }
  c.idx_flops = 2.0 * Di * Hi * hist;  // MSA §7: history pages only
  c.idx_bytes = 4.0 * (double(unique_kv_tokens) * Di + double(T) * Hi * Di + double(Hi) * T * cols);
  c.topk_bytes = 4.0 * (double(Hi) * T * cols + double(Hi) * T * K);
  c.attn_flops = 4.0 * D * Hq * sel_tokens;
  // Query-major without L2 reuse: every (row, KV head) streams its selected K and V (fp32) once; plus q and out.
  c.attn_bytes = 4.0 * (Hkv * sel_tokens * 2 * D + 2.0 * T * Hq * D);
  return c;
}

void bench_prefill(int64_t C, int64_t L) {
  Setup s;
  build(s, {{L, int(C)}}, 1000 + uint64_t(L));
  cuda::MsaIndexer ix;
  ix.plan(s.h_pos, s.h_row, Hi, B, false, nullptr);
  s.scores.grow(static_cast<size_t>(Hi * C * ix.max_cols()));
  cuda::MsaPrefill pf;
  pf.plan(s.h_pos, Hkv, G, D, B, K, nullptr);
  const float scale = 1.f / std::sqrt(float(D));
  auto idx = [&] { ix.run(s.iq.get(), s.ik(), s.rows(), s.scores.get(), nullptr); };
  auto topk = [&] { cuda::msa_topk(s.scores.get(), int(C), Hi, s.pos.get(), B, ix.max_cols(), K, s.sel.get(), nullptr); };
  auto attn = [&] { pf.run(s.q.get(), s.sel.get(), s.rows(), s.kv(), scale, s.out.get(), nullptr); };
  idx(), topk(), attn();
  pf.check(nullptr);
  const Counts c = count(s, ix.max_cols(), L);
  const std::string name = "prefill C=" + std::to_string(C) + " KV=" + std::to_string(L);
  const Stats a = time_events(idx), b = time_events(topk), d = time_events(attn);
  const Stats all = time_events([&] { idx(), topk(), attn(); });
  row(name, "indexer scores", a, c.idx_flops, c.idx_bytes);
  row(name, "top-k", b, 0, c.topk_bytes);
  row(name, "sparse attention", d, c.attn_flops, c.attn_bytes);
  row(name, "MSA total", all, c.idx_flops + c.attn_flops, c.idx_bytes + c.topk_bytes + c.attn_bytes);
}

void bench_decode(int batch, int64_t L) {
  Setup s;
  build(s, std::vector<std::pair<int64_t, int>>(static_cast<size_t>(batch), {L, 1}), 2000 + uint64_t(L) + uint64_t(batch));
  cuda::MsaIndexer ix;
  ix.plan(s.h_pos, s.h_row, Hi, B, true, nullptr);
  s.scores.grow(static_cast<size_t>(Hi * batch * ix.max_cols()));
  cuda::MsaDecode dc;
  dc.plan(s.h_pos, Hkv, G, D, B, K, true, nullptr);
  const float scale = 1.f / std::sqrt(float(D));
  auto idx = [&] { ix.run(s.iq.get(), s.ik(), s.rows(), s.scores.get(), nullptr); };
  auto topk = [&] { cuda::msa_topk(s.scores.get(), batch, Hi, s.pos.get(), B, ix.max_cols(), K, s.sel.get(), nullptr); };
  auto attn = [&] { dc.run(s.q.get(), s.sel.get(), s.rows(), s.kv(), scale, s.out.get(), nullptr); };
  idx(), topk(), attn();
  dc.check(nullptr);
  const Counts c = count(s, ix.max_cols(), int64_t(batch) * L);
  const std::string name = "decode B=" + std::to_string(batch) + " ctx=" + std::to_string(L) + " Q=1";
  const Stats a = time_events(idx), b = time_events(topk), d = time_events(attn);
  const Stats all = time_events([&] { idx(), topk(), attn(); });
  row(name, "indexer scores", a, c.idx_flops, c.idx_bytes);
  row(name, "top-k", b, 0, c.topk_bytes);
  row(name, "sparse attn s=" + std::to_string(dc.splits()), d, c.attn_flops, c.attn_bytes);
  row(name, "MSA total", all, c.idx_flops + c.attn_flops, c.idx_bytes + c.topk_bytes + c.attn_bytes);
}

void bench_ceilings() {
  const size_t n = static_cast<size_t>(1) << 29;  // 2 GiB of floats
  DeviceBuffer<float> a(n), b(n);
  bench::fill_uniform(a.get(), int64_t(n), 7, 0.1f, 1.f);
  const Stats cp = time_events([&] { M3_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n * 4, cudaMemcpyDeviceToDevice, nullptr)); });
  g_bw = 2.0 * double(n) * 4 / (cp.median_ms * 1e-3);
  a.reset(), b.reset();
  const int64_t M = 8192;
  DeviceBuffer<float> x(static_cast<size_t>(M * M)), y(static_cast<size_t>(M * M)), wf(static_cast<size_t>(M * M));
  DeviceBuffer<uint16_t> w(static_cast<size_t>(M * M));
  bench::fill_uniform(x.get(), M * M, 8, 0.1f, 1.f);
  bench::fill_uniform(wf.get(), M * M, 9, 0.1f, 1.f);
  cuda::f32_to_bf16(wf.get(), M * M, w.get(), nullptr);
  cuda::Gemm g;
  const Stats gm = time_events([&] { g.nt(x.get(), M, M, w.get(), cuda::WType::BF16, M, y.get(), false, nullptr); });
  g_tc = 2.0 * double(M) * M * M / (gm.median_ms * 1e-3);
  std::printf("| ceiling | value | median ms | CV |\n|---|---|---|---|\n");
  std::printf("| D2D copy 2 GiB (read + write) | %.0f GB/s | %.3f | %.1f%% |\n", g_bw / 1e9, cp.median_ms, 100 * cp.cv);
  std::printf("| bf16 GEMM 8192³ via cuBLASLt (incl. x→bf16) | %.0f TFLOP/s | %.3f | %.1f%% |\n", g_tc / 1e12,
              gm.median_ms, 100 * gm.cv);
  std::printf("| fp32 CUDA-core peak (datasheet, not measured) | %.0f TFLOP/s | | |\n", kSimt / 1e12);
}

void bench_tiny(const std::string& dir) {
  const M3Config cfg = load_m3_config(dir + "/config.json");
  std::printf("\n| tiny model (%s) decode step, 1 sequence at 300 tokens | median ms | CV | floor µs (weights / BW) |\n",
              dir.substr(dir.find_last_of('/') + 1).c_str());
  std::printf("|---|---|---|---|\n");
  std::vector<int32_t> ids(300);
  std::mt19937 r(5);
  for (auto& x : ids) x = int32_t(r() % uint32_t(cfg.vocab_size));
  const int32_t pages = 32;
  std::vector<int32_t> pt(static_cast<size_t>(pages));
  std::iota(pt.begin(), pt.end(), 0);
  for (bool bf16 : {true, false}) {
    CudaExecutorOptions opt;
    opt.bf16_weights = bf16;
    auto ex = CudaExecutor::load(dir, pages, opt);
    SeqInput pre{ids, 0, pt, false};
    ex->forward(std::span<const SeqInput>(&pre, 1));
    const int32_t tok = ids[7];
    SeqInput step{std::span<const int32_t>(&tok, 1), 300, pt, false};
    const Stats s = time_host([&] { ex->forward(std::span<const SeqInput>(&step, 1)); }, 5, 31);
    // Floor: every weight byte read once (all experts counted: an upper bound on the bytes of one token).
    double wbytes = 0;
    const double es = bf16 ? 2 : 4, H = cfg.hidden_size;
    for (int l = 0; l < cfg.num_layers; ++l) {
      wbytes += es * H * ((cfg.num_q_heads + 2.0 * cfg.num_kv_heads) * cfg.head_dim + cfg.num_q_heads * cfg.head_dim);
      if (cfg.attn_kinds[static_cast<size_t>(l)] == AttnKind::Sparse) wbytes += es * H * (cfg.index_num_heads + 1.0) * cfg.index_head_dim;
      if (cfg.mlp_kinds[static_cast<size_t>(l)] == MlpKind::Dense)
        wbytes += es * 3 * H * cfg.dense_intermediate_size;
      else
        wbytes += es * 3 * H * (double(cfg.num_experts) * cfg.moe_intermediate_size + cfg.shared_intermediate_size) +
                  4.0 * H * cfg.num_experts;
    }
    wbytes += es * H * cfg.vocab_size;
    std::printf("| CudaExecutor %s weights (host wall clock incl. upload + logits copy) | %.3f | %.1f%% | %.2f |\n",
                bf16 ? "bf16" : "fp32", s.median_ms, 100 * s.cv, wbytes / g_bw * 1e6);
  }
  M3Model cpu = M3Model::load(dir);
  KVCache cache(cfg, pages);
  SeqInput pre{ids, 0, pt, false};
  cpu.forward(std::span<const SeqInput>(&pre, 1), cache);
  const int32_t tok = ids[7];
  SeqInput step{std::span<const int32_t>(&tok, 1), 300, pt, false};
  const Stats s = time_host([&] { cpu.forward(std::span<const SeqInput>(&step, 1), cache); }, 3, 21);
  std::printf("| CPU reference (fp32, host threads) | %.3f | %.1f%% | |\n", s.median_ms, 100 * s.cv);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  try {
    if (cuda::device_count() == 0) {
      std::printf("bench_msa: no CUDA device\n");
      return 1;
    }
    cudaDeviceProp p{};
    M3_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("device: %s, %d SMs, L2 %d MiB\n\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
    bench_ceilings();
    header();
    for (int64_t L : {int64_t(16384), int64_t(65536)}) bench_prefill(quick ? 2048 : 16384, L);
    for (int64_t L : {int64_t(16384), int64_t(65536)})
      for (int b : {8, 64}) bench_decode(b, L);
    if (!model.empty()) bench_tiny(model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_msa: %s\n", e.what());
    return 1;
  }
  return 0;
}
