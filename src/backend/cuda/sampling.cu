#include "backend/cuda/sampling.cuh"

#include <cub/cub.cuh>

#include "base/rng.h"

#include <algorithm>
#include <cstring>

namespace m3::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kItems = 8;
constexpr int kCap = kThreads * kItems;  // candidates sorted in shared memory
constexpr int kRankCap = 1024;           // up to this many: rank by counting (cheaper than a 64-bit radix sort)
constexpr int kBinBits = 11;
constexpr int kBins = 1 << kBinBits;
constexpr int kAdjustCtas = 16;
constexpr double kWeightScale = 1099511627776.0;  // 2^40 (base/rng.h)
// Keys order the candidates as the CPU sorts them: larger logit first, then lower id. −0 counts as +0 (equal
// floats, so the id decides, as in the CPU's comparison).
__device__ __forceinline__ uint32_t ord_of(float l) {
  const uint32_t b = __float_as_uint(l == 0.f ? 0.f : l);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float logit_of(uint64_t k) {
  const uint32_t o = uint32_t(k >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ uint64_t key_of(float l, int32_t id) {
  return (uint64_t(ord_of(l)) << 32) | uint64_t(0xffffffffu - uint32_t(id));
}
__device__ __forceinline__ int32_t id_of(uint64_t k) { return int32_t(0xffffffffu - uint32_t(k)); }

// The fixed-point weight (base/rng.h): the same fp32 operations as the CPU sampler's.
__device__ __forceinline__ uint64_t weight(float l, float m, float t) { return sample_weight_of(l, m, t); }

// r = floor(bits53 · total / 2^53) (sample_draw_point in base/rng.h).
__device__ __forceinline__ uint64_t draw_point(uint64_t bits53, uint64_t total) {
  return __umul64hi(bits53 << 11, total);
}

// Every logit of a row with its id: vector loads when the row allows, four in flight per thread (one CTA reads a
// whole 800 KB row, so memory-level parallelism per thread is what sets the pass time).
template <class F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ row, int V, F&& f) {
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int n4 = V / 4;
    int i = threadIdx.x;
    for (; i + 3 * kThreads < n4; i += 4 * kThreads) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = r4[i + u * kThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int b = 4 * (i + u * kThreads);
        f(v[u].x, b);
        f(v[u].y, b + 1);
        f(v[u].z, b + 2);
        f(v[u].w, b + 3);
      }
    }
    for (; i < n4; i += kThreads) {
      const float4 v = r4[i];
      f(v.x, 4 * i);
      f(v.y, 4 * i + 1);
      f(v.z, 4 * i + 2);
      f(v.w, 4 * i + 3);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += kThreads) f(row[i], i);
  }
}

struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};
struct MinOp {
  template <class T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const { return b < a ? b : a; }
};
__device__ __forceinline__ unsigned long long umax64(unsigned long long a, unsigned long long b) { return a < b ? b : a; }

using U64Reduce = cub::BlockReduce<unsigned long long, kThreads>;
using IntReduce = cub::BlockReduce<int, kThreads>;
using DblReduce = cub::BlockReduce<double, kThreads>;
using FltReduce = cub::BlockReduce<float, kThreads>;
using U64Scan = cub::BlockScan<unsigned long long, kThreads>;
using KeySort = cub::BlockRadixSort<unsigned long long, kThreads, kItems>;

struct Hist {
  unsigned int cnt[kBins];
  unsigned long long mass[kBins];
  unsigned long long key[kBins];  // the largest key of the bin (the token itself once the bin holds one)
};

// The big buffers share memory (one is live at a time); the collectives' scratch is apart, since they run while
// a histogram is still being read.
struct Smem {
  union {
    Hist h;
    unsigned long long cand[kCap];
    KeySort::TempStorage sort;
  };
  U64Scan::TempStorage scan;
  U64Reduce::TempStorage ru;
  IntReduce::TempStorage ri;
  DblReduce::TempStorage rd;
  FltReduce::TempStorage rf;
};

struct Scalars {
  int n;
  int bin;
  unsigned long long acc, cnt, mass, key, total;
};

__device__ unsigned long long block_max_u64(unsigned long long v, Smem& sm, Scalars& sc) {
  v = U64Reduce(sm.ru).Reduce(v, MaxOp());
  if (threadIdx.x == 0) sc.key = v;
  __syncthreads();
  v = sc.key;
  __syncthreads();
  return v;
}
__device__ unsigned long long block_sum_u64(unsigned long long v, Smem& sm, Scalars& sc) {
  v = U64Reduce(sm.ru).Sum(v);
  if (threadIdx.x == 0) sc.total = v;
  __syncthreads();
  v = sc.total;
  __syncthreads();
  return v;
}
__device__ int block_min_int(int v, Smem& sm, Scalars& sc) {
  v = IntReduce(sm.ri).Reduce(v, MinOp());
  if (threadIdx.x == 0) sc.n = v;
  __syncthreads();
  v = sc.n;
  __syncthreads();
  return v;
}

// ---- the shared path: every candidate that can weigh is in sm.cand[0, n) ----------------------------------------
__device__ int32_t sample_shared(int n, const SampleRowParams& p, int64_t k1, float m, Smem& sm, Scalars& sc) {
  const int tid = threadIdx.x;
  unsigned long long k[kItems];
  if (n <= kRankCap) {
    // Rank by counting: key j goes to position #{keys > key j} (keys are unique: they hold the id).
    unsigned long long mine[kRankCap / kThreads];
    int rank[kRankCap / kThreads];
    for (int j = 0; j < kRankCap / kThreads; ++j) {
      const int i = tid + j * kThreads;
      mine[j] = i < n ? sm.cand[i] : 0ull;
      rank[j] = 0;
    }
    for (int i = 0; i < n; ++i) {
      const unsigned long long o = sm.cand[i];
      for (int j = 0; j < kRankCap / kThreads; ++j) rank[j] += o > mine[j];
    }
    __syncthreads();
    for (int j = 0; j < kRankCap / kThreads; ++j)
      if (tid + j * kThreads < n) sm.cand[rank[j]] = mine[j];
    __syncthreads();
    for (int j = 0; j < kItems; ++j) {
      const int i = tid * kItems + j;
      k[j] = i < n ? sm.cand[i] : 0ull;
    }
    __syncthreads();
  } else {
    for (int j = 0; j < kItems; ++j) {
      const int i = tid * kItems + j;
      k[j] = i < n ? sm.cand[i] : 0ull;
    }
    __syncthreads();
    KeySort(sm.sort).SortDescending(k);  // blocked: thread t holds positions [t·kItems, +kItems)
    __syncthreads();
  }
  const int n1 = int(k1 < int64_t(n) ? k1 : int64_t(n));  // top_k
  unsigned long long w[kItems], c[kItems];
  for (int j = 0; j < kItems; ++j) {
    const int i = tid * kItems + j;
    w[j] = i < n1 ? weight(logit_of(k[j]), m, p.temperature) : 0ull;
  }
  U64Scan(sm.scan).InclusiveSum(w, c);
  __syncthreads();
  // Top-k mass (what top_p is a fraction of).
  for (int j = 0; j < kItems; ++j)
    if (tid * kItems + j == n1 - 1) sc.total = c[j];
  __syncthreads();
  const unsigned long long s1 = sc.total;
  __syncthreads();
  int n2 = n1;
  if (p.min_p > 0.f) {  // first weight below the floor ends the prefix (never the first: it weighs 2^40)
    const double floor = double(p.min_p) * kWeightScale;
    int first = INT_MAX;
    for (int j = 0; j < kItems; ++j) {
      const int i = tid * kItems + j;
      if (i < n1 && double(w[j]) < floor) first = min(first, i);
    }
    first = block_min_int(first, sm, sc);
    n2 = max(1, min(n1, first));
  }
  int n3 = n2;
  if (p.top_p < 1.f) {
    const double x = double(p.top_p) * double(s1);
    int first = INT_MAX;
    for (int j = 0; j < kItems; ++j) {
      const int i = tid * kItems + j;
      if (i < n2 && double(c[j]) >= x) first = min(first, i);
    }
    first = block_min_int(first, sm, sc);
    if (first != INT_MAX) n3 = first + 1;
  }
  for (int j = 0; j < kItems; ++j)
    if (tid * kItems + j == n3 - 1) sc.total = c[j];
  __syncthreads();
  const unsigned long long r = draw_point(p.bits53, sc.total);
  __syncthreads();
  int first = INT_MAX;
  for (int j = 0; j < kItems; ++j) {
    const int i = tid * kItems + j;
    if (i < n3 && r < c[j]) first = min(first, i);
  }
  first = block_min_int(first, sm, sc);
  if (first == INT_MAX) first = n3 - 1;
  for (int j = 0; j < kItems; ++j)
    if (tid * kItems + j == first) sc.key = k[j];
  __syncthreads();
  const int32_t id = id_of(sc.key);
  __syncthreads();
  return id;
}

// ---- the select path: radix select over the row in global memory -------------------------------------------------
enum Mode { kCount, kMassGe, kMassGt };

struct Found {
  bool found;
  unsigned long long key, above, key_mass, total;  // above: metric of the tokens before `key`; total: all of them
};

// Among the tokens with key ≥ lo and weight ≥ floor, in key order (descending): the first where the running
// metric (count for kCount, mass otherwise) reaches `target` (kCount: ≥ target_u; kMassGe: double(mass) ≥ target_d;
// kMassGt: mass > target_u). found = false when the whole set does not reach it (total = its metric).
// frac > 0 (kMassGe): target_d = frac × (mass of the keys ≥ lo, without the floor), summed in the first pass.
__device__ Found find(const float* row, int V, float m, float t, unsigned long long lo, double floor, Mode mode,
                      unsigned long long target_u, double target_d, double frac, Smem& sm, Scalars& sc) {
  constexpr int kShift[6] = {53, 42, 32, 21, 10, 0};
  constexpr int kBits[6] = {11, 11, 10, 11, 11, 10};  // [63:53] [52:42] [41:32] | id [31:21] [20:10] [9:0]
  const bool need_w = mode != kCount || floor > 0.0;
  unsigned long long prefix = 0, above = 0;
  Found f{false, 0, 0, 0, 0};
  for (int pass = 0; pass < 6; ++pass) {
    const int shift = kShift[pass], nb = 1 << kBits[pass], hi = shift + kBits[pass];
    for (int b = threadIdx.x; b < nb; b += kThreads) sm.h.cnt[b] = 0, sm.h.mass[b] = 0, sm.h.key[b] = 0;
    __syncthreads();
    unsigned long long s_all = 0;
    for_each_logit(row, V, [&](float l, int i) {
      const unsigned long long key = key_of(l, i);
      if (key < lo || (hi < 64 && (key >> hi) != (prefix >> hi))) return;
      unsigned long long w = 0;
      if (need_w) {
        w = weight(l, m, t);
        s_all += w;
        if (double(w) < floor) return;
      }
      const int b = int((key >> shift) & unsigned(nb - 1));
      atomicAdd(&sm.h.cnt[b], 1u);
      if (mode != kCount) atomicAdd(&sm.h.mass[b], w);
      atomicMax(&sm.h.key[b], key);
    });
    __syncthreads();
    if (pass == 0 && frac > 0.0) target_d = frac * double(block_sum_u64(s_all, sm, sc));
    // Bins in key order (descending): position j ↔ bin nb − 1 − j; thread t owns positions [t·per, +per).
    const int per = nb / kThreads;
    unsigned long long mine = 0;
    for (int q = 0; q < per; ++q) {
      const int b = nb - 1 - (threadIdx.x * per + q);
      mine += mode == kCount ? sm.h.cnt[b] : sm.h.mass[b];
    }
    unsigned long long before, all;
    U64Scan(sm.scan).ExclusiveSum(mine, before, all);
    if (threadIdx.x == 0) sc.bin = -1;
    __syncthreads();
    if (pass == 0) f.total = all;
    auto reached = [&](unsigned long long v) {
      return mode == kCount ? v >= target_u : mode == kMassGe ? double(v) >= target_d : v > target_u;
    };
    unsigned long long acc = above + before;
    for (int q = 0; q < per; ++q) {
      const int b = nb - 1 - (threadIdx.x * per + q);
      const unsigned long long v = mode == kCount ? sm.h.cnt[b] : sm.h.mass[b];
      if (!reached(acc) && reached(acc + v) && sm.h.cnt[b] > 0) {
        sc.bin = b, sc.acc = acc, sc.cnt = sm.h.cnt[b], sc.mass = sm.h.mass[b], sc.key = sm.h.key[b];
      }
      acc += v;
    }
    __syncthreads();
    const int bin = sc.bin;
    if (bin < 0) {  // only possible in the first pass: the set does not reach the target
      __syncthreads();
      return f;
    }
    above = sc.acc;
    prefix |= (unsigned long long)bin << shift;
    const unsigned long long cnt = sc.cnt, mass = sc.mass, key = sc.key;
    __syncthreads();
    if (cnt == 1 || pass == 5) {
      f.found = true;
      f.key = key;
      f.above = above;
      f.key_mass = mass;
      return f;
    }
  }
  return f;
}

__device__ unsigned long long mass_of(const float* row, int V, float m, float t, unsigned long long lo, double floor,
                                      Smem& sm, Scalars& sc) {
  unsigned long long s = 0;
  for_each_logit(row, V, [&](float l, int i) {
    if (key_of(l, i) < lo) return;
    const unsigned long long w = weight(l, m, t);
    if (double(w) >= floor) s += w;
  });
  return block_sum_u64(s, sm, sc);
}

__device__ int32_t sample_select(const float* row, int V, const SampleRowParams& p, int64_t k1, float m, Smem& sm,
                                 Scalars& sc) {
  const float t = p.temperature;
  unsigned long long lo = 0;
  if (k1 < V) lo = find(row, V, m, t, 0, 0.0, kCount, (unsigned long long)k1, 0.0, 0.0, sm, sc).key;  // k-th best
  const double floor = p.min_p > 0.f ? double(p.min_p) * kWeightScale : 0.0;
  unsigned long long total = 0, lo3 = lo;
  if (p.top_p < 1.f) {  // the top_p cut (its target from the top-k mass, summed in the same first pass)
    const Found f = find(row, V, m, t, lo, floor, kMassGe, 0, 0.0, double(p.top_p), sm, sc);
    if (f.found) {
      lo3 = f.key;
      total = f.above + f.key_mass;
    } else {
      total = f.total;
    }
  } else {
    total = mass_of(row, V, m, t, lo, floor, sm, sc);
  }
  const unsigned long long r = draw_point(p.bits53, total);
  const Found f = find(row, V, m, t, lo3, floor, kMassGt, r, 0.0, 0.0, sm, sc);
  return id_of(f.key);
}

// ---- kernels -------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) adjust_kernel(float* __restrict__ logits, int V,
                                                          const uint8_t* __restrict__ stage, int cap,
                                                          float* __restrict__ raw, int32_t* __restrict__ counts) {
  const int R = *reinterpret_cast<const int32_t*>(stage);
  const SampleRowParams* rows = reinterpret_cast<const SampleRowParams*>(stage + 16);
  const int32_t* pool = reinterpret_cast<const int32_t*>(stage + 16 + size_t(cap) * sizeof(SampleRowParams));
  int32_t* cnt = counts + int64_t(blockIdx.x) * V;
  for (int r = blockIdx.x; r < R; r += gridDim.x) {
    const SampleRowParams p = rows[r];
    if (!p.active) continue;
    float* row = logits + int64_t(p.logit_row) * V;
    if (p.top_logprobs >= 0) {
      float* dst = raw + int64_t(r) * V;
      for (int i = threadIdx.x; i < V; i += kThreads) dst[i] = row[i];
      __syncthreads();
    }
    const int32_t* toks = pool + p.tok_off;
    if (p.repetition != 1.f && p.n_tok > 0) {  // each distinct token once
      for (int i = threadIdx.x; i < p.n_tok; i += kThreads) atomicOr(&cnt[toks[i]], 1);
      __syncthreads();
      for (int i = threadIdx.x; i < p.n_tok; i += kThreads) {
        const int32_t tk = toks[i];
        if (atomicExch(&cnt[tk], 0) != 0) {
          const float v = row[tk];
          row[tk] = v > 0.f ? __fdiv_rn(v, p.repetition) : __fmul_rn(v, p.repetition);
        }
      }
      __syncthreads();
    }
    if ((p.presence != 0.f || p.frequency != 0.f) && p.n_tok > p.gen_begin) {
      for (int i = p.gen_begin + threadIdx.x; i < p.n_tok; i += kThreads) atomicAdd(&cnt[toks[i]], 1);
      __syncthreads();
      for (int i = p.gen_begin + threadIdx.x; i < p.n_tok; i += kThreads) {
        const int32_t tk = toks[i];
        const int n = atomicExch(&cnt[tk], 0);
        if (n != 0) row[tk] = __fsub_rn(row[tk], __fadd_rn(p.presence, __fmul_rn(p.frequency, float(n))));
      }
      __syncthreads();
    }
    if (p.n_bias > 0) {  // in order, as the CPU adds them (ids may repeat)
      if (threadIdx.x == 0)
        for (int j = 0; j < p.n_bias; ++j) {
          const int32_t tk = pool[p.bias_off + j];
          row[tk] = __fadd_rn(row[tk], __int_as_float(pool[p.bias_off + p.n_bias + j]));
        }
      __syncthreads();
    }
    for (int j = threadIdx.x; j < p.n_mask; j += kThreads) row[pool[p.mask_off + j]] = -INFINITY;
    if (p.allow_off >= 0) {  // the grammar's bitmask: one word read per 32 ids
      const uint32_t* allow = reinterpret_cast<const uint32_t*>(pool + p.allow_off);
      for (int i = threadIdx.x; i < V; i += kThreads)
        if (!((allow[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int V,
                                                          const uint8_t* __restrict__ stage, int cap,
                                                          const float* __restrict__ raw, int32_t* __restrict__ ids,
                                                          SampleLogprobs* __restrict__ lps) {
  __shared__ Smem sm;
  __shared__ Scalars sc;
  const int R = *reinterpret_cast<const int32_t*>(stage);
  const int r = blockIdx.x;
  if (r >= R) return;
  const SampleRowParams p = reinterpret_cast<const SampleRowParams*>(stage + 16)[r];
  if (!p.active) {
    if (threadIdx.x == 0) ids[r] = -1;
    return;
  }
  const float* row = logits + int64_t(p.logit_row) * V;
  // Pass 0: the largest key = the largest logit, lowest id (the CPU's argmax).
  unsigned long long best = 0;
  for_each_logit(row, V, [&](float l, int i) { best = umax64(best, key_of(l, i)); });
  best = block_max_u64(best, sm, sc);
  int32_t pick = id_of(best);
  const float m = logit_of(best);
  if (p.temperature != 0.f && p.top_k != 1 && isfinite(m)) {
    const int64_t k1 = p.top_k > 0 ? min(p.top_k, V) : V;
    // Pass 1: compact the tokens that can weigh anything.
    if (threadIdx.x == 0) sc.n = 0;
    __syncthreads();
    const double t = double(p.temperature);
    for_each_logit(row, V, [&](float l, int i) {
      // A superset of x ≥ −28 (the exact weights come later): no division per token.
      if (!(double(l) - double(m) >= -28.5 * t)) return;
      const int at = atomicAdd(&sc.n, 1);
      if (at < kCap) sm.cand[at] = key_of(l, i);
    });
    __syncthreads();
    const int n = sc.n;
    __syncthreads();
    pick = n <= kCap ? sample_shared(n, p, k1, m, sm, sc) : sample_select(row, V, p, k1, m, sm, sc);
  }
  if (threadIdx.x == 0) ids[r] = pick;
  if (p.top_logprobs < 0) return;
  // Logprobs of the raw logits (before penalties and temperature): log-sum-exp in fp64, then the top ones in key
  // order by repeated maxima below the previous key.
  const float* rr = raw + int64_t(r) * V;
  float mx = -INFINITY;
  for_each_logit(rr, V, [&](float l, int) { mx = fmaxf(mx, l); });
  mx = FltReduce(sm.rf).Reduce(mx, MaxOp());
  if (threadIdx.x == 0) sc.total = __double_as_longlong(double(mx));
  __syncthreads();
  const double m0 = __longlong_as_double((long long)sc.total);
  __syncthreads();
  double s = 0.0;
  for_each_logit(rr, V, [&](float l, int) { s += exp(double(l) - m0); });
  s = DblReduce(sm.rd).Sum(s);
  if (threadIdx.x == 0) sc.total = __double_as_longlong(m0 + log(s));
  __syncthreads();
  const double lse = __longlong_as_double((long long)sc.total);
  __syncthreads();
  SampleLogprobs* o = lps + r;
  if (threadIdx.x == 0) {
    o->chosen = float(double(rr[pick]) - lse);
    o->n_top = min(p.top_logprobs, min(kMaxTopLogprobs, V));
  }
  unsigned long long prev = ~0ull;
  for (int j = 0; j < min(p.top_logprobs, min(kMaxTopLogprobs, V)); ++j) {
    unsigned long long b = 0;
    for_each_logit(rr, V, [&](float l, int i) {
      const unsigned long long k = key_of(l, i);
      if (k < prev) b = umax64(b, k);
    });
    b = block_max_u64(b, sm, sc);
    if (threadIdx.x == 0) {
      o->top_ids[j] = id_of(b);
      o->top_logprobs[j] = float(double(logit_of(b)) - lse);
    }
    prev = b;
  }
}

}  // namespace

DeviceSampler::~DeviceSampler() {
  if (h_stage_) cudaFreeHost(h_stage_);
  if (h_out_) cudaFreeHost(h_out_);
}

size_t DeviceSampler::stage_bytes() const {
  return 16 + size_t(cap_rows_) * sizeof(SampleRowParams) + pool_cap_ * sizeof(int32_t);
}
size_t DeviceSampler::out_bytes() const {
  return size_t(cap_rows_) * (sizeof(int32_t) + sizeof(SampleLogprobs));
}

void DeviceSampler::reserve(int max_rows, int vocab, bool logprobs) {
  M3_CUDA_REQUIRE(max_rows >= 0 && vocab > 0 && int64_t(max_rows) * vocab < (int64_t(1) << 31),
                  "sampler: bad capacity %d rows × %d", max_rows, vocab);
  M3_CUDA_REQUIRE(vocab_ == 0 || vocab == vocab_, "sampler: vocabulary %d (sized for %d)", vocab, vocab_);
  const bool new_vocab = counts_.size() == 0;
  if (max_rows > cap_rows_ || new_vocab || pool_.size() > pool_cap_) {
    cap_rows_ = std::max(max_rows, cap_rows_);
    vocab_ = vocab;
    pool_cap_ = std::max(pool_cap_, std::max(pool_.size(), size_t(4096)));
    if (h_stage_) cudaFreeHost(h_stage_);
    if (h_out_) cudaFreeHost(h_out_);
    h_stage_ = h_out_ = nullptr;
    M3_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_stage_), stage_bytes()));
    M3_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_out_), out_bytes()));
    h_ids_ = reinterpret_cast<int32_t*>(h_out_);
    h_lp_ = reinterpret_cast<SampleLogprobs*>(h_out_ + size_t(cap_rows_) * sizeof(int32_t));
    d_stage_.reset();
    d_stage_.grow(stage_bytes());
    d_out_.reset();
    d_out_.grow(out_bytes());
    if (new_vocab) {
      counts_.grow(size_t(kAdjustCtas) * size_t(vocab));
      M3_CUDA_CHECK(cudaMemset(counts_.get(), 0, counts_.size() * sizeof(int32_t)));
    }
  }
  if (logprobs) raw_.grow(size_t(cap_rows_) * size_t(vocab_));
}

void DeviceSampler::begin(int vocab) {
  M3_CUDA_REQUIRE(vocab > 0 && (vocab_ == 0 || vocab == vocab_), "sampler: vocabulary %d (sized for %d)", vocab,
                  vocab_);
  vocab_ = vocab;
  rows_.clear();
  pool_.clear();
  any_logprobs_ = false;
}

void DeviceSampler::add_row(const SampleRowParams& p0, const int32_t* tokens, int n_tokens, int gen_begin,
                            const int32_t* bias_ids, const float* bias_values, int n_bias, const int32_t* mask,
                            int n_mask, const uint32_t* allowed) {
  SampleRowParams p = p0;
  M3_CUDA_REQUIRE(p.temperature >= 0.f && p.top_p > 0.f && p.top_p <= 1.f && p.min_p >= 0.f && p.min_p <= 1.f &&
                      p.top_logprobs <= kMaxTopLogprobs && p.logit_row >= 0 && p.bits53 < (uint64_t(1) << 53),
                  "sampler: row %zu parameters out of range", rows_.size());
  M3_CUDA_REQUIRE(n_tokens >= 0 && gen_begin >= 0 && gen_begin <= n_tokens && n_bias >= 0 && n_mask >= 0,
                  "sampler: row %zu bad list sizes", rows_.size());
  auto in_vocab = [&](const int32_t* v, int n) {
    for (int i = 0; i < n; ++i)
      if (v[i] < 0 || (vocab_ > 0 && v[i] >= vocab_)) return false;
    return true;
  };
  M3_CUDA_REQUIRE(in_vocab(tokens, n_tokens) && in_vocab(bias_ids, n_bias) && in_vocab(mask, n_mask),
                  "sampler: row %zu has a token id outside the vocabulary", rows_.size());
  const bool penalties = p.active && (p.repetition != 1.f || p.presence != 0.f || p.frequency != 0.f);
  p.tok_off = int32_t(pool_.size());
  p.n_tok = penalties ? n_tokens : 0;
  p.gen_begin = penalties ? gen_begin : 0;
  if (penalties) pool_.insert(pool_.end(), tokens, tokens + n_tokens);
  p.bias_off = int32_t(pool_.size());
  p.n_bias = p.active ? n_bias : 0;
  if (p.n_bias) {
    pool_.insert(pool_.end(), bias_ids, bias_ids + n_bias);
    for (int j = 0; j < n_bias; ++j) {
      int32_t bits;
      std::memcpy(&bits, &bias_values[j], 4);
      pool_.push_back(bits);
    }
  }
  p.mask_off = int32_t(pool_.size());
  p.n_mask = p.active ? n_mask : 0;
  if (p.n_mask) pool_.insert(pool_.end(), mask, mask + n_mask);
  p.allow_off = -1;
  if (p.active && allowed) {
    p.allow_off = int32_t(pool_.size());
    const size_t words = (size_t(vocab_) + 31) / 32;
    const size_t at = pool_.size();
    pool_.resize(at + words);
    std::memcpy(pool_.data() + at, allowed, words * 4);
  }
  if (!p.active) p.top_logprobs = -1;
  any_logprobs_ = any_logprobs_ || p.top_logprobs >= 0;
  rows_.push_back(p);
}

void DeviceSampler::enqueue(float* logits, cudaStream_t s) {
  upload(s);
  launch(logits, s);
}

void DeviceSampler::upload(cudaStream_t s) {
  const int R = int(rows_.size());
  if (R == 0) return;
  reserve(R, vocab_, any_logprobs_);
  // The one upload: count, rows, pool.
  const int32_t n = R;
  std::memcpy(h_stage_, &n, 4);
  std::memcpy(h_stage_ + 16, rows_.data(), size_t(R) * sizeof(SampleRowParams));
  const size_t pool_at = 16 + size_t(cap_rows_) * sizeof(SampleRowParams);
  if (!pool_.empty()) std::memcpy(h_stage_ + pool_at, pool_.data(), pool_.size() * 4);
  M3_CUDA_CHECK(cudaMemcpyAsync(d_stage_.get(), h_stage_, pool_at + pool_.size() * 4, cudaMemcpyHostToDevice, s));
}

void DeviceSampler::launch(float* logits, cudaStream_t s) {
  if (cap_rows_ == 0) return;
  int32_t* d_ids = reinterpret_cast<int32_t*>(d_out_.get());
  SampleLogprobs* d_lp = reinterpret_cast<SampleLogprobs*>(d_out_.get() + size_t(cap_rows_) * sizeof(int32_t));
  adjust_kernel<<<unsigned(std::min(cap_rows_, kAdjustCtas)), kThreads, 0, s>>>(logits, vocab_, d_stage_.get(),
                                                                                 cap_rows_, raw_.get(), counts_.get());
  M3_CUDA_LAUNCH_CHECK();
  sample_kernel<<<unsigned(cap_rows_), kThreads, 0, s>>>(logits, vocab_, d_stage_.get(), cap_rows_, raw_.get(), d_ids,
                                                        d_lp);
  M3_CUDA_LAUNCH_CHECK();
}

void DeviceSampler::finish(cudaStream_t s) {
  const int R = int(rows_.size());
  if (R == 0) return;
  // The one read-back: ids [R], or ids [cap] followed by the logprob rows [R] when a row asked for them.
  const size_t bytes = any_logprobs_ ? size_t(cap_rows_) * 4 + size_t(R) * sizeof(SampleLogprobs) : size_t(R) * 4;
  M3_CUDA_CHECK(cudaMemcpyAsync(h_out_, d_out_.get(), bytes, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace m3::cuda
