// Implementation of decode_tc_checks.h (see there).
#include "decode_tc_checks.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/msa_decode_index.cuh"
#include "backend/cuda/paged_decode_mq.cuh"
#include "backend/cuda/paged_decode_tc.cuh"

namespace m3::decode_check {

namespace {

using bf16 = __nv_bfloat16;

template <typename T>
struct DevVec {
  cuda::DeviceBuffer<T> b;
  explicit DevVec(const std::vector<T>& h) {
    b.grow(h.size());
    if (!h.empty()) M3_CUDA_CHECK(cudaMemcpy(b.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  T* get() const { return b.get(); }
};
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) M3_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// n random bf16 values in ±[0.05, 1] (never zero) and their exact fp32 values. One draw from g seeds a splitmix64
// stream (sign and a 24-bit fraction from one 64-bit value): the pools hold up to ~10^9 values (the wide case), which
// mt19937_64 with uniform_real_distribution took over a minute to fill on the device host.
void rand_bf16(std::mt19937_64& g, size_t n, std::vector<bf16>& b, std::vector<float>& f) {
  uint64_t z = g();
  b.resize(n), f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = (z += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float u = 0.05f + 0.95f * float(x & 0xFFFFFF) * 0x1p-24f;
    b[i] = __float2bfloat16((x >> 63) ? -u : u);
    f[i] = __bfloat162float(b[i]);
  }
}

// Every row t is its own sequence: pages [rows_pt_indptr[t], +local + 1) of a random permutation of the pool.
struct Rows {
  std::vector<int32_t> pos, row_seq, pt_indptr, pt_pages;
  int num_pages = 0;
  Rows(std::mt19937_64& g, const std::vector<int32_t>& positions, int block) : pos(positions) {
    const int T = int(pos.size());
    row_seq.resize(T);
    pt_indptr.assign(T + 1, 0);
    for (int t = 0; t < T; ++t) row_seq[t] = t, pt_indptr[t + 1] = pt_indptr[t] + pos[t] / block + 1;
    num_pages = pt_indptr[T] + 3;  // a few pages nobody owns
    std::vector<int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    pt_pages.assign(perm.begin(), perm.begin() + pt_indptr[T]);
  }
};

}  // namespace

namespace {

// One attention case: rows, random bf16 K/V/Q pools (and their fp32 values), the page lists.
struct AttnCase {
  static constexpr int D = 128, Bk = 128;
  int T = 0, Hkv = 0, G = 0, Hq = 0, R = 0, top_k = 0, max_pages = 0;
  bool sparse = false;
  int64_t page_elems = 0;
  Rows rows;
  std::vector<bf16> kb, vb, qb;
  std::vector<float> kf, vf, qf;
  std::vector<int32_t> sel, indptr, indices, last;
  AttnCase(std::mt19937_64& g, const std::vector<int32_t>& positions, int hkv, int gq, bool sp, int k)
      : T(int(positions.size())), Hkv(hkv), G(gq), Hq(hkv * gq), R(T * hkv), top_k(k), sparse(sp),
        page_elems(int64_t(hkv) * Bk * D), rows(g, positions, Bk) {
    rand_bf16(g, size_t(rows.num_pages) * page_elems, kb, kf);
    rand_bf16(g, size_t(rows.num_pages) * page_elems, vb, vf);
    rand_bf16(g, size_t(T) * Hq * D, qb, qf);
    sel.assign(size_t(Hkv) * T * top_k, -1), indptr.assign(R + 1, 0), last.resize(R);
    for (int t = 0; t < T; ++t) {
      const int local = positions[t] / Bk;
      for (int h = 0; h < Hkv; ++h) {
        std::vector<int32_t> blocks;
        if (sparse) {
          const int n = std::min(top_k, local + 1);
          std::vector<int32_t> hist(local);
          std::iota(hist.begin(), hist.end(), 0);
          std::shuffle(hist.begin(), hist.end(), g);
          blocks.assign(hist.begin(), hist.begin() + (n - 1));
          blocks.push_back(local);
          std::copy(blocks.begin(), blocks.end(), sel.begin() + (int64_t(h) * T + t) * top_k);
        } else {
          for (int b = 0; b <= local; ++b) blocks.push_back(b);
        }
        const int r = t * Hkv + h;
        for (int b : blocks) indices.push_back(rows.pt_pages[rows.pt_indptr[t] + b] * Hkv + h);
        indptr[r + 1] = int32_t(indices.size());
        last[r] = positions[t] % Bk + 1;
        max_pages = std::max(max_pages, int(blocks.size()));
      }
    }
  }
  float scale() const { return 1.f / std::sqrt(float(D)); }

  // PagedDecodeTc over the given device pools (run twice, the second with PDL); the bf16 output.
  template <typename KvT>
  std::vector<bf16> run_gpu(const KvT* dk, const KvT* dv, float k_scale, float v_scale, bool allow_split,
                            int schedule = 0) const {
    DevVec<bf16> dq(qb);
    DevVec<int32_t> dind(indptr), didx(indices), dlast(last);
    cuda::DeviceBuffer<bf16> dout(size_t(T) * Hq * D);
    M3_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, size_t(T) * Hq * D * sizeof(bf16)));  // NaN poison
    cuda::PagedDecodeTc op;
    op.plan(R, G, max_pages, allow_split, false, cuda::PagedDecodeTc::Schedule(schedule));
    cuda::PagedDecodeTcArgs<KvT> a;
    a.q = dq.get(), a.out = dout.get(), a.k = dk, a.v = dv;
    a.stride_page = int64_t(Bk) * D, a.stride_tok = D;
    a.indptr = dind.get(), a.indices = didx.get(), a.last_len = dlast.get();
    a.R = R, a.G = G, a.scale = scale(), a.k_scale = k_scale, a.v_scale = v_scale;
    for (int rep = 0; rep < 2; ++rep) op.run(a, nullptr, rep == 1);  // second run with PDL
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(dout.get(), size_t(T) * Hq * D);
  }

  // The CPU twin on fp32 pools k, v.
  std::vector<float> cpu_ref(const std::vector<float>& k, const std::vector<float>& v) const {
    cpu::PagedKV kv{k.data(), v.data(), page_elems, Hkv, Bk, D};
    std::vector<float> ref(size_t(T) * Hq * D);
    for (int t = 0; t < T; ++t) {
      const int32_t* pt = rows.pt_pages.data() + rows.pt_indptr[t];
      if (sparse) {
        std::vector<int32_t> srow(size_t(Hkv) * top_k);
        for (int h = 0; h < Hkv; ++h)
          std::copy_n(sel.begin() + (int64_t(h) * T + t) * top_k, top_k, srow.begin() + h * top_k);
        cpu::attention_sparse(qf.data() + size_t(t) * Hq * D, 1, Hq, &rows.pos[t], kv, pt, srow.data(), top_k,
                              scale(), ref.data() + size_t(t) * Hq * D);
      } else {
        cpu::attention_dense_causal(qf.data() + size_t(t) * Hq * D, 1, Hq, &rows.pos[t], kv, pt, scale(),
                                    ref.data() + size_t(t) * Hq * D);
      }
    }
    return ref;
  }

  // Element-wise against the reference: |gpu − cpu| ≤ 2e-2·max|cpu| + 1e-3 (bf16 P and output rounding).
  Result compare(const std::vector<bf16>& out, const std::vector<float>& ref) const {
    Result res;
    for (float x : ref) res.max_ref = std::max(res.max_ref, double(std::fabs(x)));
    const double tol = 2e-2 * res.max_ref + 1e-3;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float o = __bfloat162float(out[i]);
      const double err = std::isfinite(o) ? std::fabs(double(o) - ref[i]) : INFINITY;
      res.max_err = std::max(res.max_err, err);
      if (!(err <= tol)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "out[%zu] (row %zu, head %zu, d %zu) = %g, cpu %g", i, i / (Hq * D),
                      i / D % Hq, i % D, double(o), double(ref[i]));
        res.fail(buf);
      }
    }
    return res;
  }
};

// ‖a − ref‖ / ‖ref‖.
double rel_l2(const std::vector<bf16>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(__bfloat162float(a[i])) - ref[i];
    num += d * d, den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0;
}

// FP8 inputs: every 7th value ×2^−8, so that with the per-tensor scale amax/448 the small e4m3 codes (subnormals
// included) occur too. bf16 values stay exact (power-of-two factor).
void spread_small(std::vector<bf16>& b, std::vector<float>& f) {
  for (size_t i = 0; i < b.size(); i += 7) {
    f[i] = std::ldexp(f[i], -8);
    b[i] = __float2bfloat16(f[i]);
  }
}
float amax_scale(const std::vector<float>& f) {
  float m = 0.f;
  for (float x : f) m = std::max(m, std::fabs(x));
  return m > 0.f ? m / 448.f : 1.f;
}

// The device quantiser into a new e4m3 buffer, checked byte for byte against its CPU twin (every element of the
// first 2^22, then every 97th: the twin costs ~10 ns per value and the pools hold up to ~10^8), and the values the
// device codes stand for (the CPU reference's input).
cuda::DeviceBuffer<uint8_t> quantise_checked(const bf16* dsrc, const std::vector<float>& f, float scale,
                                             std::vector<float>& deq, Result& res, const char* what) {
  const int64_t n = int64_t(f.size());
  cuda::DeviceBuffer<uint8_t> q(size_t(n) + 16);
  cuda::kv_quantize_e4m3(dsrc, n, scale, reinterpret_cast<cuda::e4m3_t*>(q.get()), nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = to_host(q.get(), size_t(n));
  for (int64_t i = 0; i < n; i += i < (int64_t(1) << 22) ? 1 : 97) {
    uint8_t want;
    cpu::kv_quantize_e4m3(&f[size_t(i)], 1, scale, &want);
    if (got[size_t(i)] != want) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "kv_quantize_e4m3 (%s) [%lld] = 0x%02x, cpu 0x%02x", what, (long long)i,
                    got[size_t(i)], want);
      res.fail(buf);
      break;
    }
  }
  deq.resize(size_t(n));
  cpu::kv_dequantize_e4m3(got.data(), n, scale, deq.data());
  return q;
}

}  // namespace

Result check_paged_decode(uint64_t seed, const std::vector<int32_t>& positions, int Hkv, int G, bool sparse,
                          bool allow_split, int top_k, int schedule) {
  std::mt19937_64 g(seed);
  const AttnCase c(g, positions, Hkv, G, sparse, top_k);
  DevVec<bf16> dk(c.kb), dv(c.vb);
  return c.compare(c.run_gpu(dk.get(), dv.get(), 1.f, 1.f, allow_split, schedule), c.cpu_ref(c.kf, c.vf));
}

Result check_paged_decode_fp8(uint64_t seed, const std::vector<int32_t>& positions, int Hkv, int G, bool sparse,
                              bool allow_split, Fp8Accuracy* acc, int top_k) {
  std::mt19937_64 g(seed);
  AttnCase c(g, positions, Hkv, G, sparse, top_k);
  spread_small(c.kb, c.kf);
  spread_small(c.vb, c.vf);
  const float ks = amax_scale(c.kf), vs = amax_scale(c.vf);
  DevVec<bf16> dk(c.kb), dv(c.vb);
  Result quant;
  std::vector<float> kdq, vdq;
  const auto k8 = quantise_checked(dk.get(), c.kf, ks, kdq, quant, "K");
  const auto v8 = quantise_checked(dv.get(), c.vf, vs, vdq, quant, "V");
  const auto out8 = c.run_gpu(reinterpret_cast<const cuda::e4m3_t*>(k8.get()),
                              reinterpret_cast<const cuda::e4m3_t*>(v8.get()), ks, vs, allow_split);
  const auto ref8 = c.cpu_ref(kdq, vdq);
  Result res = c.compare(out8, ref8);
  if (quant.bad) res.fail(quant.what);
  if (acc) {  // the accuracy cost: both caches against the fp32 attention over the bf16 values
    const auto ref = c.cpu_ref(c.kf, c.vf);
    const auto out16 = c.run_gpu(dk.get(), dv.get(), 1.f, 1.f, allow_split);
    acc->attn_rel_l2_vs_twin = rel_l2(out8, ref8);
    acc->attn_rel_l2_fp8 = rel_l2(out8, ref);
    acc->attn_rel_l2_bf16 = rel_l2(out16, ref);
    acc->attn_rel_l2_fp8_vs_bf16 = 0;
    {
      double num = 0, den = 0;
      for (size_t i = 0; i < out8.size(); ++i) {
        const double a = __bfloat162float(out8[i]), b = __bfloat162float(out16[i]);
        num += (a - b) * (a - b), den += b * b;
      }
      acc->attn_rel_l2_fp8_vs_bf16 = den > 0 ? std::sqrt(num / den) : 0;
    }
  }
  return res;
}

Result check_paged_decode_mq(uint64_t seed, const std::vector<int32_t>& last_pos, const std::vector<int>& qs, int Hkv,
                             int G, MqSelection mode, bool allow_split, int top_k) {
  constexpr int D = 128, Bk = 128, W = 128;  // W: selection width of the CPU twin (dense lists up to 128 pages)
  std::mt19937_64 g(seed);
  const int N = int(last_pos.size());
  std::vector<int32_t> req_indptr(N + 1, 0), pos, pt_indptr(N + 1, 0);
  int max_q = 1;
  for (int n = 0; n < N; ++n) {
    for (int q = 0; q < qs[n]; ++q) pos.push_back(std::max(0, last_pos[n] - qs[n] + 1 + q));
    req_indptr[n + 1] = req_indptr[n] + qs[n];
    pt_indptr[n + 1] = pt_indptr[n] + last_pos[n] / Bk + 1;
    max_q = std::max(max_q, qs[n]);
  }
  const int T = int(pos.size()), Hq = Hkv * G, R = T * Hkv;
  const int num_pages = pt_indptr[N] + 3;  // a few pages nobody owns
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  const int64_t page_elems = int64_t(Hkv) * Bk * D;
  std::vector<bf16> kb, vb, qb;
  std::vector<float> kf, vf, qf;
  rand_bf16(g, size_t(num_pages) * page_elems, kb, kf);
  rand_bf16(g, size_t(num_pages) * page_elems, vb, vf);
  rand_bf16(g, size_t(T) * Hq * D, qb, qf);
  auto sample = [&](int range, int k) {  // k distinct blocks of [0, range)
    std::vector<int32_t> v(range);
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), g);
    v.resize(k);
    return v;
  };
  // Page lists in PagedDecodeTc's layout: list t·Hkv + h; sel [Hkv, T, W] for the CPU twin.
  std::vector<std::vector<int32_t>> lists(R);
  std::vector<int32_t> sel(size_t(Hkv) * T * W, -1), last(R);
  int max_pages = 0;
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < Hkv; ++h) {
      const int t0 = req_indptr[n], L0 = pos[t0] / Bk;
      const std::vector<int32_t> base = sample(std::max(top_k - 1, L0), top_k - 1);
      for (int t = t0; t < req_indptr[n + 1]; ++t) {
        const int local = pos[t] / Bk;
        std::vector<int32_t> blocks;
        if (mode == MqSelection::kDense || local + 1 <= top_k) {
          for (int b = 0; b < local; ++b) blocks.push_back(b);
        } else if (mode == MqSelection::kRandom) {
          blocks = sample(local, top_k - 1);
        } else {
          blocks = base;
          const int drift = t == t0 ? 0 : 1 + int(g() % 2);
          for (int d = 0; d < drift; ++d) {
            int32_t p;
            do p = int32_t(g() % local);
            while (std::find(blocks.begin(), blocks.end(), p) != blocks.end());
            blocks[g() % blocks.size()] = p;
          }
          if (local > L0 && std::find(blocks.begin(), blocks.end(), L0) == blocks.end())
            blocks[g() % blocks.size()] = L0;
        }
        std::sort(blocks.begin(), blocks.end());
        blocks.push_back(local);
        const int r = t * Hkv + h;
        for (size_t i = 0; i < blocks.size(); ++i) {
          sel[(size_t(h) * T + t) * W + i] = blocks[i];
          lists[r].push_back(perm[pt_indptr[n] + blocks[i]] * Hkv + h);
        }
        last[r] = pos[t] % Bk + 1;
        max_pages = std::max(max_pages, int(blocks.size()));
      }
    }
  std::vector<int32_t> indptr(R + 1, 0), indices;
  for (int r = 0; r < R; ++r) {
    indices.insert(indices.end(), lists[r].begin(), lists[r].end());
    indptr[r + 1] = int32_t(indices.size());
  }
  DevVec<bf16> dk(kb), dv(vb), dq(qb);
  DevVec<int32_t> dind(indptr), didx(indices), dlast(last), dreq(req_indptr);
  const size_t out_n = size_t(T) * Hq * D;
  cuda::DeviceBuffer<bf16> dout(out_n), drow(out_n);
  M3_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, out_n * sizeof(bf16)));  // NaN poison
  M3_CUDA_CHECK(cudaMemset(drow.get(), 0xFF, out_n * sizeof(bf16)));
  const float scale = 1.f / std::sqrt(float(D));
  cuda::PagedDecodeMq op;
  op.plan(N, Hkv, G, max_q, max_pages, allow_split);
  cuda::PagedDecodeMqArgs<bf16> a;
  a.q = dq.get(), a.out = dout.get(), a.k = dk.get(), a.v = dv.get();
  a.stride_page = int64_t(Bk) * D, a.stride_tok = D;
  a.indptr = dind.get(), a.indices = didx.get(), a.last_len = dlast.get(), a.req_indptr = dreq.get();
  a.N = N, a.Hkv = Hkv, a.G = G, a.scale = scale;
  for (int rep = 0; rep < 2; ++rep) op.run(a, nullptr, rep == 1);  // second run with PDL
  cuda::PagedDecodeTc rowwise;
  rowwise.plan(R, G, max_pages, true);
  cuda::PagedDecodeTcArgs<bf16> b;
  b.q = dq.get(), b.out = drow.get(), b.k = dk.get(), b.v = dv.get();
  b.stride_page = a.stride_page, b.stride_tok = a.stride_tok;
  b.indptr = dind.get(), b.indices = didx.get(), b.last_len = dlast.get();
  b.R = R, b.G = G, b.scale = scale;
  rowwise.run(b, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> out = to_host(dout.get(), out_n), row_out = to_host(drow.get(), out_n);

  cpu::PagedKV kv{kf.data(), vf.data(), page_elems, Hkv, Bk, D};
  std::vector<float> ref(out_n);
  for (int n = 0; n < N; ++n)
    for (int t = req_indptr[n]; t < req_indptr[n + 1]; ++t) {
      std::vector<int32_t> srow(size_t(Hkv) * W);
      for (int h = 0; h < Hkv; ++h) std::copy_n(sel.begin() + (size_t(h) * T + t) * W, W, srow.begin() + h * W);
      cpu::attention_sparse(qf.data() + size_t(t) * Hq * D, 1, Hq, &pos[t], kv, perm.data() + pt_indptr[n],
                            srow.data(), W, scale, ref.data() + size_t(t) * Hq * D);
    }
  Result res;
  for (float x : ref) res.max_ref = std::max(res.max_ref, double(std::fabs(x)));
  const double tol = 2e-2 * res.max_ref + 1e-3;  // check_paged_decode's
  for (size_t i = 0; i < out_n; ++i) {
    const float o = __bfloat162float(out[i]), w = __bfloat162float(row_out[i]);
    const double err = std::isfinite(o) ? std::fabs(double(o) - ref[i]) : INFINITY;
    const double err_row = std::isfinite(o) && std::isfinite(w) ? std::fabs(double(o) - w) : INFINITY;
    res.max_err = std::max(res.max_err, err);
    res.max_err_rowwise = std::max(res.max_err_rowwise, err_row);
    if (!(err <= tol) || !(err_row <= tol)) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "out[%zu] (row %zu, head %zu, d %zu) = %g, cpu %g, per-row kernel %g", i,
                    i / (Hq * D), i / D % Hq, i % D, double(o), double(ref[i]), double(w));
      res.fail(buf);
    }
  }
  return res;
}

namespace {

// One scorer case: rows and random bf16 index keys / queries.
struct IndexCase {
  static constexpr int Di = 128, Bk = 128;
  int T = 0, H = 0, top_k = 0;
  int64_t ppu = 1, page_elems = int64_t(Bk) * Di;
  Rows rows;
  std::vector<bf16> kb, qb;
  std::vector<float> kf, qf;
  IndexCase(std::mt19937_64& g, const std::vector<int32_t>& positions, int h, int k, int64_t p)
      : T(int(positions.size())), H(h), top_k(k), ppu(p), rows(g, positions, Bk) {
    rand_bf16(g, size_t(rows.num_pages) * page_elems, kb, kf);
    rand_bf16(g, size_t(T) * H * Di, qb, qf);
  }
  struct Out {
    int64_t cols = 0;
    std::vector<float> scores;
    std::vector<int32_t> sel, indptr, last, indices;
  };
  template <typename KT>
  Out run_gpu(const KT* dk, float scale, int radix_max = -1) const {
    DevVec<bf16> dq(qb);
    DevVec<int32_t> dpos(rows.pos), dseq(rows.row_seq), dpti(rows.pt_indptr), dptp(rows.pt_pages);
    cuda::DevStepRows drows{dpos.get(), dseq.get(), dpti.get(), dptp.get(), T};
    cuda::MsaDecodeIndex op;
    op.set_radix_max(radix_max);
    op.plan(rows.pos, drows, H, top_k, ppu, nullptr);
    Out o;
    o.cols = op.max_cols();
    M3_CUDA_CHECK(cudaMemset(const_cast<float*>(op.scores()), 0xFF, size_t(H) * T * o.cols * sizeof(float)));
    M3_CUDA_CHECK(cudaMemset(const_cast<int32_t*>(op.selection()), 0x7F, size_t(H) * T * top_k * sizeof(int32_t)));
    M3_CUDA_CHECK(
        cudaMemset(const_cast<int32_t*>(op.attn_indices()), 0x7F, size_t(H) * T * top_k * sizeof(int32_t)));
    cuda::DevPagedIndexKT<KT> cache{dk, page_elems, scale};
    for (int rep = 0; rep < 2; ++rep) op.run(dq.get(), cache, drows, nullptr, rep == 1);  // twice (tickets), PDL
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    o.scores = to_host(op.scores(), size_t(H) * T * o.cols);
    o.sel = to_host(op.selection(), size_t(H) * T * top_k);
    o.indptr = to_host(op.attn_indptr(), size_t(T) * H + 1);
    o.last = to_host(op.attn_last_len(), size_t(T) * H);
    o.indices = to_host(op.attn_indices(), size_t(T) * H * top_k);
    return o;
  }

  // Scores within score_tol·max(1, |cpu|) of cpu::msa_block_scores on the keys kref; the selection equal to the
  // CPU top-k of the GPU's own scores; against the CPU top-k of the CPU scores only near-tie swaps; the page list.
  Result check(const Out& o, const std::vector<float>& kref, double score_tol) const {
    const int64_t cols = o.cols;
    Result res;
    cpu::PagedIndexK ck{kref.data(), page_elems, Bk, Di};
    char buf[200];
    int nv_sum = 0;
    for (int t = 0; t < T; ++t) {
      const int pos = rows.pos[t], local = pos / Bk, nb = local + 1, n = std::min(top_k, nb);
      const int32_t* pt = rows.pt_pages.data() + rows.pt_indptr[t];
      std::vector<float> cs(size_t(H) * nb), gs(size_t(H) * nb, -INFINITY);
      cpu::msa_block_scores(qf.data() + size_t(t) * H * Di, 1, H, &pos, ck, pt, nb, cs.data());
      const bool ranked = nb > top_k;
      for (int h = 0; h < H; ++h)
        for (int b = 0; ranked && b < local; ++b) {
          const float x = o.scores[(int64_t(h) * T + t) * cols + b], c = cs[size_t(h) * nb + b];
          gs[size_t(h) * nb + b] = x;
          res.max_ref = std::max(res.max_ref, double(std::fabs(c)));
          const double err = std::isfinite(x) ? std::fabs(double(x) - c) : INFINITY;
          res.max_err = std::max(res.max_err, err);
          if (!(err <= score_tol * std::max(1.0, double(std::fabs(c))))) {
            std::snprintf(buf, sizeof buf, "score[h %d, row %d, block %d] = %g, cpu %g", h, t, b, double(x),
                          double(c));
            res.fail(buf);
          }
        }
      std::vector<int32_t> sel_own(size_t(H) * top_k), sel_cpu(size_t(H) * top_k);
      cpu::msa_topk(gs.data(), 1, H, &pos, Bk, nb, top_k, sel_own.data());
      cpu::msa_topk(cs.data(), 1, H, &pos, Bk, nb, top_k, sel_cpu.data());
      for (int h = 0; h < H; ++h) {
        const int32_t* gsel = o.sel.data() + (int64_t(h) * T + t) * top_k;
        const int r = t * H + h;
        if (o.indptr[r] != H * nv_sum + h * n || o.last[r] != pos % Bk + 1) {
          std::snprintf(buf, sizeof buf, "page list header of request %d: indptr %d last %d", r, o.indptr[r],
                        o.last[r]);
          res.fail(buf);
          continue;
        }
        for (int s = 0; s < top_k; ++s) {
          if (gsel[s] != sel_own[h * top_k + s]) {
            std::snprintf(buf, sizeof buf, "selection[h %d, row %d, slot %d] = %d, cpu top-k of gpu scores %d", h, t,
                          s, gsel[s], sel_own[h * top_k + s]);
            res.fail(buf);
          }
          if (s < n && o.indices[o.indptr[r] + s] != int32_t(pt[std::clamp(gsel[s], 0, local)] * ppu + h)) {
            std::snprintf(buf, sizeof buf, "page list[r %d, slot %d] = %d", r, s, o.indices[o.indptr[r] + s]);
            res.fail(buf);
          }
        }
        if (!ranked) continue;
        // Near ties against the CPU's own scores: the K−1-th best CPU score bounds every allowed swap.
        std::vector<float> hist(cs.begin() + size_t(h) * nb, cs.begin() + size_t(h) * nb + local);
        std::nth_element(hist.begin(), hist.begin() + (top_k - 2), hist.end(), std::greater<float>());
        const float kth = hist[top_k - 2];
        for (int s = 0; s + 1 < top_k; ++s) {
          const int b = gsel[s];
          if (std::find(sel_cpu.begin() + h * top_k, sel_cpu.begin() + (h + 1) * top_k, b) ==
                  sel_cpu.begin() + (h + 1) * top_k &&
              !(b >= 0 && b < local &&
                std::fabs(cs[size_t(h) * nb + b] - kth) <= 1e-3 * std::max(1.f, std::fabs(kth)))) {
            std::snprintf(buf, sizeof buf, "row %d head %d picks block %d (cpu score %g), not a near tie of %g", t,
                          h, b, b >= 0 && b < local ? double(cs[size_t(h) * nb + b]) : 0.0, double(kth));
            res.fail(buf);
          }
        }
      }
      nv_sum += n;
    }
    if (o.indptr[size_t(T) * H] != H * nv_sum) res.fail("page list total");
    return res;
  }
};

}  // namespace

Result check_decode_index(uint64_t seed, const std::vector<int32_t>& positions, int H, int top_k, int64_t ppu,
                          int radix_max) {
  std::mt19937_64 g(seed);
  const IndexCase c(g, positions, H, top_k, ppu);
  DevVec<bf16> dk(c.kb);
  return c.check(c.run_gpu(dk.get(), 1.f, radix_max), c.kf, 1e-3);
}

Result check_decode_index_ties(uint64_t seed, const std::vector<int32_t>& positions, int H, int period,
                               int radix_max) {
  std::mt19937_64 g(seed);
  IndexCase c(g, positions, H, 16, 4);
  for (int t = 0; t < c.T; ++t) {
    int32_t* pt = c.rows.pt_pages.data() + c.rows.pt_indptr[t];
    for (int b = period; b < c.rows.pos[t] / c.Bk; ++b) pt[b] = pt[b % period];
  }
  DevVec<bf16> dk(c.kb);
  return c.check(c.run_gpu(dk.get(), 1.f, radix_max), c.kf, 1e-3);
}

Result check_decode_index_fp8(uint64_t seed, const std::vector<int32_t>& positions, int H, Fp8Accuracy* acc,
                              float scale, int top_k, int64_t ppu) {
  std::mt19937_64 g(seed);
  IndexCase c(g, positions, H, top_k, ppu);
  spread_small(c.kb, c.kf);
  if (scale <= 0.f) scale = amax_scale(c.kf);
  DevVec<bf16> dk(c.kb);
  Result quant;
  std::vector<float> kdq;
  const auto k8 = quantise_checked(dk.get(), c.kf, scale, kdq, quant, "index-K");
  const auto o8 = c.run_gpu(reinterpret_cast<const cuda::e4m3_t*>(k8.get()), scale);
  Result res = c.check(o8, kdq, 1e-5);
  if (quant.bad) res.fail(quant.what);
  if (acc) {  // selections of the e4m3 cache vs the bf16 cache on the same keys, per ranked (row, head)
    const auto o16 = c.run_gpu(dk.get(), 1.f);
    int64_t same = 0, n = 0, blocks_same = 0, blocks = 0;
    for (int t = 0; t < c.T; ++t) {
      if (c.rows.pos[t] / c.Bk + 1 <= top_k) continue;
      for (int h = 0; h < H; ++h) {
        const int32_t* a = o8.sel.data() + (int64_t(h) * c.T + t) * top_k;
        const int32_t* b = o16.sel.data() + (int64_t(h) * c.T + t) * top_k;
        const std::vector<int32_t> sa(a, a + top_k), sb(b, b + top_k);  // both ascending ids, local last
        same += sa == sb, ++n;
        for (int32_t x : sa) blocks_same += std::find(sb.begin(), sb.end(), x) != sb.end();
        blocks += top_k;
      }
    }
    acc->sel_rows = n;
    acc->sel_identical = n ? double(same) / double(n) : 1.0;
    acc->sel_blocks_shared = blocks ? double(blocks_same) / double(blocks) : 1.0;
  }
  return res;
}

}  // namespace m3::decode_check
