// Benchmark of the bf16 decode kernels (issue 11): the index scorer fused with top-k + page-list emit
// (MsaDecodeIndex) and the tensor-core paged decode attention (PagedDecodeTc), at M3 TP1 shapes (64 Q / 4 KV heads,
// D 128, 4 index heads × 128, block 128, top-16, Q = 1), B ∈ {1, 8, 32, 64, 128} × context ∈ {8k, 16k, 64k, 128k,
// 1M}.
// Protocol (docs/KERNELS.md §9): first the correctness checks against the CPU
// twins, then per case a CUDA graph of `rot` back-to-back calls on rotated inputs (disjoint pages and queries, so the
// working set of one replay exceeds 2× L2), 5 warm-up + 25 timed replays, median per call and CV. GB/s by the MSA byte
// model (attention: K+V of the selected tokens; scorer: every index key of the batch), % of a device copy ceiling
// measured in the same run.
//   bench_decode [--json FILE] [--commit SHA] [--quick] [--multi-query [--mq-scorer]] [--fp8] [--index-only]
//                [--batches 8,64] [--ctxs 16384,65536] [--trace] [--attn-only] [--schedules 1,2] [--floors]
// --floors: only the same-size read floors (run_floors) for the listed shapes, and an empty launch's cost;
// --no-checks: skip the correctness checks (for ncu: the first launches of a kernel are then the timed shapes).
// --index-only: only the index scorer (its checks and timings; with --fp8 bf16 and e4m3 side by side);
// --batches / --ctxs: the shapes timed (default: the mode's list); --trace (with --fp8): per scorer case the
// breakdown of one call from the kernel's timer stamps (trace_breakdown), and per attention case the same for
// PagedDecodeTc (trace_slots); --attn-only (with --fp8): the attention half only; --schedules: PagedDecodeTc
// schedules timed (1 cluster, 2 balanced; default: the plan's choice); M3_DECODE_BALANCED_SHAPE=deep|wide overrides
// the balanced grid's pipeline shape.
// --fp8: only the FP8 (e4m3) cache section (issue 15 item 4): e4m3 K/V and index-K next to bf16 on the same
// shapes, B ∈ {8, 32, 64, 128} × ctx ∈ {16k, 64k, 128k}; GB/s on the bytes each variant reads (e4m3: half).
// The e4m3 checks (and their accuracy against the bf16 cache) run with the other checks in every mode.
// --multi-query: only the Q > 1 section (speculative verify / MTP rows): Q rows per request at consecutive positions,
// overlapping (each later row swaps one of the request's 15 history blocks) or independent random selections, timed
// with the per-row kernel (PagedDecodeTc, the rows as adjacent fake requests) and the union kernel (PagedDecodeMq, one
// CTA per (request, KV head) reading the union of the rows' pages once), against Q = 1 (issue 11 item 4); --json
// then writes msa_latest.json lines. --mq-scorer also times the index scorer with Q rows per request.
#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/msa_decode_index.cuh"
#include "backend/cuda/paged_decode_mq.cuh"
#include "backend/cuda/paged_decode_tc.cuh"
#include "bench_common/event_timer.h"
#include "decode_tc_checks.h"

namespace {

using bf16 = __nv_bfloat16;

// A host vector copied to a new device buffer (synchronously: the host vector may go away).
template <typename T>
struct DevVec {
  m3::cuda::DeviceBuffer<T> b;
  explicit DevVec(const std::vector<T>& h) {
    m3::cuda::upload(b, h.data(), h.size(), nullptr);
    M3_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  T* get() const { return b.get(); }
};

constexpr int kD = 128, kBlock = 128, kHkv = 4, kG = 16, kHidx = 4, kTopK = 16;
constexpr double kL2Bytes = 50e6;

__global__ void fill_bf16_kernel(bf16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    const float u = 0.05f + 0.95f * float(z & 0xFFFFFF) / float(0x1000000);
    p[i] = __float2bfloat16((z >> 40) & 1 ? u : -u);
  }
}
void fill(bf16* p, size_t n, uint64_t seed) {
  fill_bf16_kernel<<<2048, 256>>>(p, n, seed);
  M3_CUDA_CHECK(cudaGetLastError());
}

using Timing = m3::bench::CallTiming;

// Median µs per call of `calls(stream)` (rot back-to-back calls) over graph replays (bench_common/event_timer.h).
Timing time_graph(const std::function<void(cudaStream_t)>& calls, int rot) {
  return m3::bench::graph_call_timing(calls, rot);
}

// 16-byte grid-stride copy, 4 loads in flight per thread.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// Device copy ceiling (read + write bytes, 1 GiB each way): the best of a copy kernel at two grid sizes and
// cudaMemcpyAsync (graph replays back to back). *detail gets each measurement.
double copy_ceiling_gbps(std::string* detail) {
  const size_t bytes = size_t(1) << 30;
  m3::cuda::DeviceBuffer<uint8_t> a(bytes), b(bytes);
  M3_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  int sms = 0;
  M3_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double best = 0;
  char buf[160];
  for (int blocks_per_sm : {4, 16}) {
    const Timing t = time_graph(
        [&](cudaStream_t s) {
          copy_kernel<<<sms * blocks_per_sm, 256, 0, s>>>(reinterpret_cast<const uint4*>(a.get()),
                                                           reinterpret_cast<uint4*>(b.get()), bytes / 16);
          M3_CUDA_CHECK(cudaGetLastError());
        },
        1);
    const double g = 2.0 * bytes / (t.median_us * 1e3);
    std::snprintf(buf, sizeof buf, "copy kernel %d CTAs/SM %.0f GB/s; ", blocks_per_sm, g);
    *detail += buf;
    best = std::max(best, g);
  }
  const Timing tm = time_graph(
      [&](cudaStream_t s) { M3_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, 1);
  const double g = 2.0 * bytes / (tm.median_us * 1e3);
  std::snprintf(buf, sizeof buf, "cudaMemcpyAsync %.0f GB/s", g);
  *detail += buf;
  return std::max(best, g);
}

// ---- same-size floors (--floors) ------------------------------------------------------------------------------
// A read-only stream of `n` 16-byte words, 8 loads in flight per thread, XOR-reduced (the store never happens for
// this data but the compiler cannot know): what the fastest kernel that only reads the op's unique bytes costs at
// the op's size, including its ramp-up and tail — the floor the small-batch targets must be judged against, where
// the 1 GiB copy ceiling is not reachable.
__global__ void read_kernel(const uint4* __restrict__ src, size_t n, uint4* __restrict__ sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __ldcs(src + i + k * stride);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc.x ^= v[k].x, acc.y ^= v[k].y, acc.z ^= v[k].z, acc.w ^= v[k].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0xFFFFFFFFu) sink[blockIdx.x] = acc;
}
__global__ void empty_kernel() {}

// Per call: the best read of `bytes` (rotated over disjoint copies beyond 2.5 × L2, graph replays back to back, as the
// ops are timed) over grids of 1, 2, 4 and 8 CTAs of 256 threads per SM; *best_grid gets its CTAs per SM.
double read_floor_us(double bytes, int* best_grid) {
  const size_t words = size_t(bytes / 16);
  const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / bytes), 1, 64));
  m3::cuda::DeviceBuffer<uint4> buf(words * rot), sink(size_t(8) * m3::cuda::sm_count());
  M3_CUDA_CHECK(cudaMemset(buf.get(), 0x5a, words * rot * 16));
  double best = 1e30;
  for (int per_sm : {1, 2, 4, 8}) {
    const Timing t = time_graph(
        [&](cudaStream_t s) {
          for (int r = 0; r < rot; ++r)
            read_kernel<<<per_sm * m3::cuda::sm_count(), 256, 0, s>>>(buf.get() + size_t(r) * words, words, sink.get());
          M3_CUDA_CHECK(cudaGetLastError());
        },
        rot);
    if (t.median_us < best) best = t.median_us, *best_grid = per_sm;
  }
  return best;
}

// --floors: per (B, context) the read floor at the scorer's and the attention's unique bytes (bf16 and e4m3), and the
// cost of an empty launch in the same graph harness — the part of a small-batch call no kernel design removes.
void run_floors(double copy, const std::vector<int>& batches, const std::vector<int>& ctxs) {
  const Timing te = time_graph(
      [](cudaStream_t s) {
        for (int r = 0; r < 16; ++r) empty_kernel<<<m3::cuda::sm_count(), 128, 0, s>>>();
        M3_CUDA_CHECK(cudaGetLastError());
      },
      16);
  std::printf("\nempty kernel (one CTA per SM), graph replays back to back: %.2f µs per launch\n", te.median_us);
  std::printf("\n| op bytes | B | ctx | cache | MB | read floor µs | GB/s | %% of copy | CTAs/SM |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (int B : batches)
    for (int ctx : ctxs)
      for (const bool attn : {false, true})
        for (const int esize : {2, 1}) {
          const int local = (ctx - 1) / kBlock, n = std::min(kTopK, local + 1);
          const double bytes = attn ? double(B) * kHkv * ((n - 1) * kBlock + (ctx - 1) % kBlock + 1) * kD * esize * 2
                                    : double(B) * ctx * kD * esize;
          if (bytes * std::clamp<double>(std::ceil(2.5 * kL2Bytes / bytes), 1, 64) > 8e9) continue;
          int grid = 0;
          const double us = read_floor_us(bytes, &grid);
          const double gbps = bytes / (us * 1e3);
          std::printf("| %s | %d | %dk | %s | %.1f | %.2f | %.0f | %.0f%% | %d |\n", attn ? "attention K+V" : "index-K", B,
                      ctx / 1024, esize == 2 ? "bf16" : "e4m3", bytes / 1e6, us, gbps, 100 * gbps / copy, grid);
        }
}

// vLLM Triton anchors from issue 11 (µs, same shapes, one H200); 0 = not measured.
double vllm_attention(int B) { return B == 8 ? 21.0 : B == 32 ? 43.5 : B == 64 ? 76.5 : 0; }
double vllm_index(int B, int ctx) {
  if (B == 8) return ctx == 8192 ? 18.4 : ctx == 16384 ? 21.5 : ctx == 65536 ? 45.3 : ctx == 131072 ? 79.4 : 0;
  if (B == 64) return ctx == 8192 ? 46.5 : ctx == 16384 ? 77.8 : ctx == 65536 ? 268 : ctx == 131072 ? 522 : 0;
  return 0;
}

struct Record {
  std::string op, shape, variant;
  double us, gbps, pct, cv, vllm;
};

std::string fmt_anchor(double v) {
  if (v <= 0) return "—";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// ---- Q > 1: rows of a request at consecutive positions (speculative verify) ---------------------------------------
struct MqRecord {
  std::string op, shape;
  double us, gbps, x_q1, x_rowwise, bytes_x_q1;
};

// Attention: per (context, selection, B, Q) the per-row kernel (PagedDecodeTc, the Q rows as adjacent fake requests)
// and the union kernel (PagedDecodeMq), same inputs. Rows at positions ctx − Q + q; a request's logical blocks map to
// distinct pool pages (an odd multiplier mod the pool size); `overlap`: row 0 selects 15 random history blocks + the
// local one and each later row swaps one of them for another (drift 1, as neighbouring tokens do); `random`: every row
// draws its own 15. Unique bytes = union pages per (request, KV head) × 64 KiB (K + V of a page).
bool run_multi_query(double copy, bool scorer, const std::string& json_path, const std::string& commit,
                     const char* gpu) {
  const int P = 16384, n = kTopK;
  m3::cuda::DeviceBuffer<bf16> kpool(size_t(P) * kHkv * kBlock * kD), vpool(size_t(P) * kHkv * kBlock * kD);
  fill(kpool.get(), size_t(P) * kHkv * kBlock * kD, 3);
  fill(vpool.get(), size_t(P) * kHkv * kBlock * kD, 4);
  std::mt19937_64 g(11);
  std::vector<MqRecord> recs;
  std::printf("\npaged_decode_mq: resident clusters at 2 / 4 / 8 splits: %d / %d / %d\n",
              m3::cuda::PagedDecodeMq::max_active_clusters(2), m3::cuda::PagedDecodeMq::max_active_clusters(4),
              m3::cuda::PagedDecodeMq::max_active_clusters(8));
  std::printf("\n| ctx | selection | B | Q | union pages / 16 | unique MB | per-row µs | union µs | union GB/s on unique "
              "(%% of copy) | union × Q=1 | per-row × Q=1 | union / per-row | bytes × Q=1 | splits |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int ctx : {16384, 65536})
    for (int overlap : {1, 0})
      for (int B : {8, 32, 64}) {
        double t1 = 0, u1 = 0;
        for (int Q : {1, 4, 8}) {
          const int T = B * Q, R = T * kHkv, local = (ctx - 1) / kBlock;
          const double bytes_q1 = double(B) * kHkv * n * kBlock * kD * 2 * 2;
          const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / bytes_q1), 1, 64));
          std::vector<int32_t> indptr(size_t(R) + 1), last(static_cast<size_t>(R)), idx(size_t(rot) * R * n);
          std::vector<int32_t> req(size_t(B) + 1);
          for (int r = 0; r < R; ++r) indptr[size_t(r) + 1] = indptr[size_t(r)] + n;
          for (int b = 0; b <= B; ++b) req[size_t(b)] = b * Q;
          double union_pages = 0;
          auto draw = [&](std::vector<int32_t>& row, int k) {  // k more distinct history blocks
            for (int i = 0; i < k; ++i) {
              int32_t p;
              do p = int32_t(g() % local);
              while (std::find(row.begin(), row.end(), p) != row.end());
              row.push_back(p);
            }
          };
          for (int rr = 0; rr < rot; ++rr)
            for (int b = 0; b < B; ++b) {
              const uint32_t mul = uint32_t(g() | 1), add = uint32_t(g());
              auto phys = [&](int32_t blk) { return int32_t((uint32_t(blk) * mul + add) % uint32_t(P)); };
              std::vector<int32_t> base;
              draw(base, n - 1);
              std::vector<int32_t> seen;
              for (int q = 0; q < Q; ++q) {
                std::vector<int32_t> row;
                if (overlap) {
                  row = base;
                  if (q > 0) {
                    const size_t at = g() % (n - 1);
                    std::vector<int32_t> extra = row;
                    draw(extra, 1);
                    row[at] = extra.back();
                  }
                } else {
                  draw(row, n - 1);
                }
                std::sort(row.begin(), row.end());
                row.push_back(local);
                for (int32_t p : row)
                  if (std::find(seen.begin(), seen.end(), p) == seen.end()) seen.push_back(p);
                for (int h = 0; h < kHkv; ++h) {
                  const int r = (b * Q + q) * kHkv + h;
                  last[size_t(r)] = (ctx - Q + q) % kBlock + 1;
                  for (int s2 = 0; s2 < n; ++s2) idx[(size_t(rr) * R + r) * n + s2] = phys(row[size_t(s2)]) * kHkv + h;
                }
              }
              if (rr == 0) union_pages += double(seen.size()) / double(B);
            }
          DevVec<int32_t> dind(indptr), dlast(last), didx(idx), dreq(req);
          m3::cuda::DeviceBuffer<bf16> qb(size_t(rot) * R * kG * kD), out(size_t(rot) * R * kG * kD);
          fill(qb.get(), size_t(rot) * R * kG * kD, 5);
          const float scale = 1.f / std::sqrt(float(kD));
          m3::cuda::PagedDecodeTc rowwise;
          rowwise.plan(R, kG, n, true);
          const Timing tr = time_graph(
              [&](cudaStream_t s) {
                for (int r = 0; r < rot; ++r) {
                  m3::cuda::PagedDecodeTcArgs<bf16> a;
                  a.q = qb.get() + size_t(r) * R * kG * kD, a.out = out.get() + size_t(r) * R * kG * kD;
                  a.k = kpool.get(), a.v = vpool.get(), a.stride_page = int64_t(kBlock) * kD, a.stride_tok = kD;
                  a.indptr = dind.get(), a.indices = didx.get() + size_t(r) * R * n, a.last_len = dlast.get();
                  a.R = R, a.G = kG, a.scale = scale;
                  rowwise.run(a, s);
                }
              },
              rot);
          m3::cuda::PagedDecodeMq mq;
          mq.plan(B, kHkv, kG, Q, n, true);
          const Timing tm = time_graph(
              [&](cudaStream_t s) {
                for (int r = 0; r < rot; ++r) {
                  m3::cuda::PagedDecodeMqArgs<bf16> a;
                  a.q = qb.get() + size_t(r) * R * kG * kD, a.out = out.get() + size_t(r) * R * kG * kD;
                  a.k = kpool.get(), a.v = vpool.get(), a.stride_page = int64_t(kBlock) * kD, a.stride_tok = kD;
                  a.indptr = dind.get(), a.indices = didx.get() + size_t(r) * R * n, a.last_len = dlast.get();
                  a.req_indptr = dreq.get(), a.N = B, a.Hkv = kHkv, a.G = kG, a.scale = scale;
                  mq.run(a, s);
                }
              },
              rot);
          if (Q == 1) t1 = tr.median_us, u1 = union_pages;
          const double ubytes = double(B) * kHkv * union_pages * kBlock * kD * 2 * 2;
          const double gbps = ubytes / (tm.median_us * 1e3);
          std::printf("| %dk | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.0f (%.0f%%) | %.2f | %.2f | %.2f | %.2f | %d |\n",
                      ctx / 1024, overlap ? "overlap" : "random", B, Q, union_pages, ubytes / 1e6, tr.median_us,
                      tm.median_us, gbps, 100 * gbps / copy, tm.median_us / t1, tr.median_us / t1,
                      tm.median_us / tr.median_us, union_pages / u1, mq.splits());
          char shape[96];
          std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=%d %s", B, ctx / 1024, Q, overlap ? "overlap" : "random");
          recs.push_back({"paged_decode_mq", shape, tm.median_us, gbps, tm.median_us / t1, tm.median_us / tr.median_us,
                          union_pages / u1});
          recs.push_back({"paged_decode_tc", shape, tr.median_us, ubytes / (tr.median_us * 1e3), tr.median_us / t1, 1.0,
                          union_pages / u1});
        }
      }
  if (!json_path.empty()) {  // one record per line, the msa_latest.json format
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + json_path);
    for (const auto& r : recs)
      std::fprintf(f,
                   "  {\"op\": \"%s\", \"shape\": \"%s\", \"variant\": \"bf16 sm90a graph rotated, %s\", "
                   "\"median_us\": %.2f, \"gbps\": %.0f, \"x_q1\": %.2f, \"x_rowwise\": %.2f, \"bytes_x_q1\": %.2f, "
                   "\"commit\": \"%s\", \"gpu\": \"%s\"},\n",
                   r.op.c_str(), r.shape.c_str(),
                   r.op == "paged_decode_mq" ? "union of the rows' pages per (request, KV head)"
                                             : "rows of a request as adjacent fake requests",
                   r.us, r.gbps, r.x_q1, r.x_rowwise, r.bytes_x_q1, commit.c_str(), gpu);
    std::fclose(f);
  }
  if (!scorer) return true;
  // The index scorer: Q rows per request, each scoring its whole history (the rows' histories are the same pages).
  const size_t ipages_max = size_t(8) << 30 >> 15;
  m3::cuda::DeviceBuffer<bf16> ipool(ipages_max * kBlock * kD);
  fill(ipool.get(), ipages_max * kBlock * kD, 1);
  std::printf("\n| op | B | Q | ctx | median µs | × Q=1 | GB/s on the unique index bytes (%% of copy) |\n"
              "|---|---|---|---|---|---|---|\n");
  for (int B : {8, 32})
    for (int ictx : {16384, 65536}) {
      double t1 = 0;
      for (int Q : {1, 4, 8}) {
        const int npages = (ictx - 1) / kBlock + 1, T = B * Q;
        const size_t pages = size_t(B) * npages;
        const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / (pages * 32768.0)), 1, 64));
        if (pages * rot > ipages_max) continue;
        std::vector<int32_t> pos(static_cast<size_t>(T)), seq(static_cast<size_t>(T)), pti(size_t(B) + 1);
        for (int b = 0; b < B; ++b) {
          pti[size_t(b) + 1] = pti[size_t(b)] + npages;
          for (int q = 0; q < Q; ++q) pos[size_t(b * Q + q)] = ictx - Q + q, seq[size_t(b * Q + q)] = b;
        }
        std::vector<int32_t> perm(pages * size_t(rot));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g);
        DevVec<int32_t> dpos(pos), dseq(seq), dpti(pti), dperm(perm);
        m3::cuda::DeviceBuffer<bf16> iq(size_t(rot) * T * kHidx * kD);
        fill(iq.get(), size_t(rot) * T * kHidx * kD, 2);
        std::vector<m3::cuda::DevStepRows> rows(static_cast<size_t>(rot));
        for (int r = 0; r < rot; ++r) rows[size_t(r)] = {dpos.get(), dseq.get(), dpti.get(), dperm.get() + size_t(r) * pages, T};
        std::vector<m3::cuda::MsaDecodeIndex> ops(static_cast<size_t>(rot));
        for (int r = 0; r < rot; ++r) ops[size_t(r)].plan(pos, rows[size_t(r)], kHidx, kTopK, kHkv, nullptr);
        m3::cuda::DevPagedIndexKT<bf16> cache{ipool.get(), int64_t(kBlock) * kD};
        const Timing t = time_graph(
            [&](cudaStream_t s) {
              for (int r = 0; r < rot; ++r) ops[size_t(r)].run(iq.get() + size_t(r) * T * kHidx * kD, cache, rows[size_t(r)], s);
            },
            rot);
        if (Q == 1) t1 = t.median_us;
        const double gbps = double(B) * ictx * kD * 2 / (t.median_us * 1e3);
        std::printf("| msa_decode_index | %d | %d | %dk | %.1f | %.2f | %.0f (%.0f%%) |\n", B, Q, ictx / 1024,
                    t.median_us, t.median_us / t1, gbps, 100 * gbps / copy);
      }
    }
  return true;
}

// ---- FP8 (e4m3) caches (issue 15 item 4) -------------------------------------------------------------------------
// Random e4m3 codes of values ±[0.05, 1] at scale 1/448 (the pools the quantiser would write for such data).
__global__ void fill_e4m3_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    const float u = 448.f * (0.05f + 0.95f * float(z & 0xFFFFFF) / float(0x1000000));
    p[i] = uint8_t(__nv_cvt_float_to_fp8((z >> 40) & 1 ? u : -u, __NV_SATFINITE, __NV_E4M3));
  }
}
void fill_e4m3(m3::cuda::e4m3_t* p, size_t n, uint64_t seed) {
  fill_e4m3_kernel<<<2048, 256>>>(reinterpret_cast<uint8_t*>(p), n, seed);
  M3_CUDA_CHECK(cudaGetLastError());
}

// The e4m3 checks against the CPU twins, with the accuracy cost against the bf16 cache on the same data.
bool fp8_checks(bool index_only) {
  using namespace m3::decode_check;
  const std::vector<int32_t> mixed = {0, 5, 127, 128, 1000, 2047, 2048, 5000, 16383, 70000};
  std::vector<int32_t> wide;  // 160 requests > #SMs (the wide pipeline), shorter histories than the bf16 case
  for (int i = 0; i < 40; ++i) wide.push_back(97 + 173 * i);
  std::vector<int32_t> acc_rows;  // 32 rows at 4k…63k tokens: 128 ranked (row, head) selections for the accuracy
  for (int i = 0; i < 32; ++i) acc_rows.push_back(4096 + 1900 * i);
  Fp8Accuracy aa, ai;
  struct Check {
    const char* name;
    Result r;
  };
  std::vector<Check> checks;
  if (!index_only)
    checks = {
      {"paged_decode_tc e4m3 sparse G16 split", check_paged_decode_fp8(21, mixed, 4, 16, true, true, &aa)},
      {"paged_decode_tc e4m3 sparse G16 nosplit", check_paged_decode_fp8(22, mixed, 4, 16, true, false)},
      {"paged_decode_tc e4m3 sparse G8", check_paged_decode_fp8(23, mixed, 1, 8, true, true)},
      {"paged_decode_tc e4m3 dense", check_paged_decode_fp8(24, {3, 300, 4000, 9000}, 4, 16, false, true)},
      {"paged_decode_tc e4m3 sparse G16 wide", check_paged_decode_fp8(27, wide, 4, 16, true, true)},
    };
  checks.push_back({"msa_decode_index e4m3 H4", check_decode_index_fp8(25, mixed, 4)});
  checks.push_back({"msa_decode_index e4m3 H4 32 rows", check_decode_index_fp8(29, acc_rows, 4, &ai)});
  checks.push_back(
      {"msa_decode_index e4m3 H1", check_decode_index_fp8(26, {2100, 40000, 130000}, 1, nullptr, 0.f, 16, 1)});
  checks.push_back({"msa_decode_index e4m3 unscaled", check_decode_index_fp8(28, {3000, 9000, 70000}, 4, nullptr, 1.f)});
  checks.push_back({"msa_decode_index e4m3 B8 16k", check_decode_index_fp8(30, std::vector<int32_t>(8, 16383), 4)});
  bool ok = true;
  for (auto& c : checks) {
    std::printf("check %-40s max|err| %.3g / max|ref| %.3g  %s %s\n", c.name, c.r.max_err, c.r.max_ref,
                c.r.bad ? "FAIL" : "ok", c.r.what.c_str());
    ok &= c.r.bad == 0;
  }
  if (!index_only)
    std::printf("accuracy e4m3 attention (G16 split case): rel. L2 vs fp32 over the bf16 values %.3g (bf16 cache %.3g), "
              "vs the bf16 cache's output %.3g, vs its CPU twin %.3g\n",
              aa.attn_rel_l2_fp8, aa.attn_rel_l2_bf16, aa.attn_rel_l2_fp8_vs_bf16, aa.attn_rel_l2_vs_twin);
  std::printf("accuracy e4m3 index-K (32 rows, H4): %.1f %% of %lld ranked (row, head) selections identical to bf16's, "
              "%.1f %% of selected blocks shared\n",
              100 * ai.sel_identical, (long long)ai.sel_rows, 100 * ai.sel_blocks_shared);
  return ok;
}

// Where one scorer call's time goes, from the kernel's %globaltimer stamps (MsaDecodeIndex::set_trace) in the last
// replay of a graph of `rot` calls: per call the CTAs' entry spread, the first page landing (median and last CTA),
// the last page scored, the tail after it (ticket + top-k + page list of the last row) and, between calls, the gap
// from one call's last exit to the next call's first entry (negative: overlapped under PDL) and the call period;
// then the last-exiting CTA's tail split: from its last scored page to its ticket (fences + atomic), the top-k and
// page list, and what follows. Averages over calls 1..rot−1 (all calls when rot = 1; then no gap / period).
template <typename F>
void trace_breakdown(const char* what, std::vector<m3::cuda::MsaDecodeIndex>& ops, F calls) {
  using Op = m3::cuda::MsaDecodeIndex;
  const int rot = int(ops.size()), grid = ops[0].grid(), n = grid * Op::kTraceSlots;
  m3::cuda::DeviceBuffer<uint64_t> buf(size_t(rot) * n);
  M3_CUDA_CHECK(cudaMemset(buf.get(), 0, size_t(rot) * n * sizeof(uint64_t)));
  for (int r = 0; r < rot; ++r) ops[r].set_trace(buf.get() + size_t(r) * n);
  time_graph(calls, rot);
  for (auto& op : ops) op.set_trace(nullptr);
  std::vector<uint64_t> h(size_t(rot) * n);
  M3_CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  double spread = 0, first_med = 0, first_max = 0, streamed = 0, tail = 0, gap = 0, period = 0;
  double t_ticket = 0, t_topk = 0, t_after = 0;
  int m = 0, mg = 0, mt = 0;
  double prev_end = 0;
  for (int r = 0; r < rot; ++r) {
    std::vector<double> s0, s2;
    double s3max = 0, s4max = 0;
    const uint64_t* last = nullptr;  // the last CTA to exit
    for (int c = 0; c < grid; ++c) {
      const uint64_t* t = h.data() + size_t(r) * n + size_t(c) * Op::kTraceSlots;
      s0.push_back(double(t[0])), s2.push_back(double(t[2]));
      s3max = std::max(s3max, double(t[3]));
      if (double(t[4]) >= s4max) s4max = double(t[4]), last = t;
    }
    // Its slots 5 / 6 count only when stamped in this replay (between its last scored page and its exit).
    const bool split = last && last[5] >= last[3] && last[6] >= last[5] && last[4] >= last[6];
    std::sort(s0.begin(), s0.end());
    std::sort(s2.begin(), s2.end());
    const double start = s0.front();
    if (r >= 1 || rot == 1) {
      spread += s0.back() - start, first_med += s2[s2.size() / 2] - start, first_max += s2.back() - start;
      streamed += s3max - start, tail += s4max - s3max, ++m;
      if (split)
        t_ticket += double(last[5] - last[3]), t_topk += double(last[6] - last[5]), t_after += double(last[4] - last[6]),
            ++mt;
    }
    if (r >= 1) gap += start - prev_end, period += s4max - prev_end, ++mg;
    prev_end = s4max;
  }
  std::printf("trace %-28s entry spread %.2f | first page median %.2f last %.2f | last page scored %.2f | tail %.2f | "
              "gap to next call %s | period %s µs\n",
              what, spread / m / 1e3, first_med / m / 1e3, first_max / m / 1e3, streamed / m / 1e3, tail / m / 1e3,
              mg ? std::to_string(gap / mg / 1e3).substr(0, 5).c_str() : "—",
              mg ? std::to_string(period / mg / 1e3).substr(0, 5).c_str() : "—");
  if (mt)
    std::printf("trace %-28s last CTA: last page → ticket %.2f | top-k + page list %.2f | to exit %.2f µs (%d of %d "
                "calls)\n",
                what, t_ticket / mt / 1e3, t_topk / mt / 1e3, t_after / mt / 1e3, mt, m);
}

// Per-slot timing of a traced kernel (kernel-side %globaltimer stamps, `slots` per CTA, `grid` CTAs per call, `rot`
// calls per graph replay, the last replay's stamps): for each slot the median and the latest CTA, in µs after the
// call's first CTA entered, averaged over calls 1..rot−1 (all when rot = 1); then the gap from one call's last exit
// (the last slot) to the next call's first entry (negative: overlapped under PDL) and the period between exits.
void trace_slots(const char* what, const std::vector<uint64_t>& h, int rot, int grid, int slots,
                 const std::vector<const char*>& names) {
  std::vector<double> med(slots, 0), mx(slots, 0);
  double gap = 0, period = 0, prev_end = 0;
  int m = 0, mg = 0;
  for (int r = 0; r < rot; ++r) {
    const uint64_t* c = h.data() + size_t(r) * grid * slots;
    double start = 1e300, end = 0;
    for (int i = 0; i < grid; ++i)  // a CTA that never ran (a grid smaller than the buffer) left zeros
      if (c[size_t(i) * slots] != 0)
        start = std::min(start, double(c[size_t(i) * slots])),
        end = std::max(end, double(c[size_t(i) * slots + slots - 1]));
    if (r >= 1 || rot == 1) {
      for (int k = 0; k < slots; ++k) {
        std::vector<double> v;
        for (int i = 0; i < grid; ++i)
          if (c[size_t(i) * slots] != 0) v.push_back(double(c[size_t(i) * slots + k]) - start);
        std::sort(v.begin(), v.end());
        med[k] += v[v.size() / 2], mx[k] += v.back();
      }
      ++m;
    }
    if (r >= 1) gap += start - prev_end, period += end - prev_end, ++mg;
    prev_end = end;
  }
  std::printf("trace %-30s", what);
  for (int k = 0; k < slots; ++k) std::printf(" | %s %.2f / %.2f", names[k], med[k] / m / 1e3, mx[k] / m / 1e3);
  const std::string g = mg ? std::to_string(gap / mg / 1e3).substr(0, 5) : "—",
                    p = mg ? std::to_string(period / mg / 1e3).substr(0, 5) : "—";
  std::printf(" | gap %s | period %s µs (median / last CTA)\n", g.c_str(), p.c_str());
}

// bf16 and e4m3 side by side: the index scorer (+ top-k + page list) and the paged decode attention.
void run_fp8(double copy, const std::string& json_path, const std::string& commit, const char* gpu,
             std::vector<int> batches, std::vector<int> ctxs, bool index_only, bool trace,
             const std::vector<int>& schedules, bool attn_only) {
  using e4m3 = m3::cuda::e4m3_t;
  if (batches.empty()) batches = {8, 32, 64, 128};
  if (ctxs.empty()) ctxs = {16384, 65536, 131072};
  struct Rec {
    std::string op, shape, dtype, launch;
    double us, gbps, pct, cv;
  };
  std::vector<Rec> recs;
  std::mt19937_64 g(17);
  // Index pools: enough pages for the largest rotated step.
  size_t need = 0;
  for (int B : attn_only ? std::vector<int>{} : batches)
    for (int ctx : ctxs) {
      const size_t pages = size_t(B) * (ctx / kBlock);
      const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / (pages * 16384.0)), 1, 64));
      need = std::max(need, pages * rot);
    }
  {
    m3::cuda::DeviceBuffer<bf16> ip16(need * kBlock * kD);
    m3::cuda::DeviceBuffer<e4m3> ip8(need * kBlock * kD);
    fill(ip16.get(), need * kBlock * kD, 1);
    fill_e4m3(ip8.get(), need * kBlock * kD, 1);
    for (int B : attn_only ? std::vector<int>{} : batches)
      for (int ctx : ctxs) {
        const int npages = (ctx - 1) / kBlock + 1;
        const size_t pages = size_t(B) * npages;
        for (const bool f8 : {false, true}) {
          const double page_bytes = f8 ? 16384.0 : 32768.0;
          const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / (pages * page_bytes)), 1, 64));
          std::vector<int32_t> pos(B, ctx - 1), seq(B), pti(B + 1);
          for (int b = 0; b < B; ++b) seq[b] = b, pti[b + 1] = pti[b] + npages;
          std::vector<int32_t> perm(pages * rot);
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), g);
          DevVec<int32_t> dpos(pos), dseq(seq), dpti(pti), dperm(perm);
          m3::cuda::DeviceBuffer<bf16> iq(size_t(rot) * B * kHidx * kD);
          fill(iq.get(), size_t(rot) * B * kHidx * kD, 2);
          std::vector<m3::cuda::DevStepRows> rows(rot);
          for (int r = 0; r < rot; ++r) rows[r] = {dpos.get(), dseq.get(), dpti.get(), dperm.get() + size_t(r) * pages, B};
          std::vector<m3::cuda::MsaDecodeIndex> ops(rot);
          for (int r = 0; r < rot; ++r) ops[r].plan(pos, rows[r], kHidx, kTopK, kHkv, nullptr);
          const m3::cuda::DevPagedIndexKT<bf16> c16{ip16.get(), int64_t(kBlock) * kD};
          const m3::cuda::DevPagedIndexKT<e4m3> c8{ip8.get(), int64_t(kBlock) * kD, 1.f};
          for (const bool pdl : {false, true}) {
            auto calls = [&](cudaStream_t s) {
              for (int r = 0; r < rot; ++r) {
                const bf16* q = iq.get() + size_t(r) * B * kHidx * kD;
                if (f8) ops[r].run(q, c8, rows[r], s, pdl);
                else ops[r].run(q, c16, rows[r], s, pdl);
              }
            };
            const Timing t = time_graph(calls, rot);
            if (trace) {
              char what[96];
              std::snprintf(what, sizeof what, "B=%d %dk %s %s", B, ctx / 1024, f8 ? "e4m3" : "bf16",
                            pdl ? "graph+PDL" : "graph");
              trace_breakdown(what, ops, calls);
            }
            const double gbps = double(B) * ctx * kD * (f8 ? 1 : 2) / (t.median_us * 1e3);
            char shape[64];
            std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=1", B, ctx / 1024);
            recs.push_back({"msa_decode_index", shape, f8 ? "e4m3" : "bf16", pdl ? "graph+PDL" : "graph",
                            t.median_us, gbps, 100 * gbps / copy, t.cv});
          }
        }
      }
  }
  // Attention: K and V pools [P, 4, 128, 128] in both types.
  const int P = index_only ? 0 : 16384;
  const size_t pool = size_t(P) * kHkv * kBlock * kD;
  m3::cuda::DeviceBuffer<bf16> k16(pool), v16(pool);
  m3::cuda::DeviceBuffer<e4m3> k8(pool), v8(pool);
  fill(k16.get(), pool, 3), fill(v16.get(), pool, 4), fill_e4m3(k8.get(), pool, 3), fill_e4m3(v8.get(), pool, 4);
  for (int B : batches)
    for (int ctx : ctxs) {
      if (index_only) break;
      const int local = (ctx - 1) / kBlock, n = std::min(kTopK, local + 1), R = B * kHkv;
      const double tokens = double(R) * ((n - 1) * kBlock + (ctx - 1) % kBlock + 1);
      for (const bool f8 : {false, true}) {
        const double bytes = tokens * kD * (f8 ? 1 : 2) * 2;
        const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / bytes), 1, 64));
        std::vector<int32_t> indptr(R + 1), last(R, (ctx - 1) % kBlock + 1), idx(size_t(rot) * R * n);
        for (int r = 0; r < R; ++r) indptr[r + 1] = indptr[r] + n;
        for (int q = 0; q < rot; ++q)
          for (int r = 0; r < R; ++r) {
            int32_t* row = idx.data() + (size_t(q) * R + r) * n;
            for (int s = 0; s < n; ++s) {
              int32_t p;
              do p = int32_t(g() % P);
              while (std::find(row, row + s, p * kHkv + r % kHkv) != row + s);
              row[s] = p * kHkv + r % kHkv;
            }
          }
        DevVec<int32_t> dind(indptr), dlast(last), didx(idx);
        m3::cuda::DeviceBuffer<bf16> q(size_t(rot) * R * kG * kD), out(size_t(rot) * R * kG * kD);
        fill(q.get(), size_t(rot) * R * kG * kD, 5);
        for (const int sched : schedules) {
        m3::cuda::PagedDecodeTc op;
        op.plan(R, kG, n, true, false, m3::cuda::PagedDecodeTc::Schedule(sched));
        const bool bal_deep = f8 ? op.balanced_deep<e4m3>() : op.balanced_deep<bf16>();
        for (const bool pdl : {false, true}) {
          auto args = [&](auto* kp, auto* vp, int r) {
            m3::cuda::PagedDecodeTcArgs<std::remove_const_t<std::remove_pointer_t<decltype(kp)>>> a;
            a.q = q.get() + size_t(r) * R * kG * kD, a.out = out.get() + size_t(r) * R * kG * kD;
            a.k = kp, a.v = vp, a.stride_page = int64_t(kBlock) * kD, a.stride_tok = kD;
            a.indptr = dind.get(), a.indices = didx.get() + size_t(r) * R * n, a.last_len = dlast.get();
            a.R = R, a.G = kG, a.scale = 1.f / std::sqrt(float(kD)), a.k_scale = 1.f / 448, a.v_scale = 1.f / 448;
            return a;
          };
          uint64_t* stamps = nullptr;  // --trace: kTraceSlots stamps per CTA per call
          auto calls = [&](cudaStream_t s) {
            for (int r = 0; r < rot; ++r) {
              const size_t at = size_t(r) * (op.balanced() ? 2 * m3::cuda::sm_count() : R * op.splits()) *
                                m3::cuda::PagedDecodeTc::kTraceSlots;
              if (f8) {
                auto a = args(k8.get(), v8.get(), r);
                a.trace = stamps ? stamps + at : nullptr;
                op.run(a, s, pdl);
              } else {
                auto a = args(k16.get(), v16.get(), r);
                a.trace = stamps ? stamps + at : nullptr;
                op.run(a, s, pdl);
              }
            }
          };
          const Timing t = time_graph(calls, rot);
          if (trace) {
            const int grid = op.balanced() ? 2 * m3::cuda::sm_count() : R * op.splits();
            const int slots = m3::cuda::PagedDecodeTc::kTraceSlots;
            m3::cuda::DeviceBuffer<uint64_t> buf(size_t(rot) * grid * slots);
            M3_CUDA_CHECK(cudaMemset(buf.get(), 0, size_t(rot) * grid * slots * sizeof(uint64_t)));
            stamps = buf.get();
            time_graph(calls, rot);
            stamps = nullptr;
            std::vector<uint64_t> h(size_t(rot) * grid * slots);
            M3_CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
            char what[96];
            std::snprintf(what, sizeof what, "attn B=%d %dk %s %s %s", B, ctx / 1024, f8 ? "e4m3" : "bf16",
                          op.balanced() ? "bal" : "clu", pdl ? "graph+PDL" : "graph");
            trace_slots(what, h, rot, grid, slots,
                        {"entry", "page list read", "first chunk landed", "last chunk folded", "warps merged",
                         "splits synced", "splits merged", "exit"});
          }
          const double gbps = bytes / (t.median_us * 1e3);
          char shape[64];
          if (op.balanced())
            std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=1 balanced %s", B, ctx / 1024,
                          bal_deep ? "deep" : "wide");
          else
            std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=1 splits=%d %s", B, ctx / 1024, op.splits(),
                          op.deep() ? "deep" : "wide");
          recs.push_back({"paged_decode_tc", shape, f8 ? "e4m3" : "bf16", pdl ? "graph+PDL" : "graph", t.median_us,
                          gbps, 100 * gbps / copy, t.cv});
        }
        }
      }
    }
  std::printf("\n| op | shape | cache | launch | median µs | CV | GB/s (bytes read) | %% of copy | e4m3 / bf16 time |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    char ratio[32] = "";
    // The bf16 record of the same op, launch and shape (up to the pipeline shape, which may differ by type).
    auto key = [](const Rec& x) { return x.op + x.launch + x.shape.substr(0, x.shape.rfind(' ')); };
    for (size_t j = i; r.dtype == "e4m3" && j-- > 0;)
      if (recs[j].dtype == "bf16" && key(recs[j]) == key(r)) {
        std::snprintf(ratio, sizeof ratio, "%.2f", r.us / recs[j].us);
        break;
      }
    std::printf("| %s | %s | %s | %s | %.1f | %.1f%% | %.0f | %.0f%% | %s |\n", r.op.c_str(), r.shape.c_str(),
                r.dtype.c_str(), r.launch.c_str(), r.us, 100 * r.cv, r.gbps, r.pct, ratio);
  }
  if (json_path.empty()) return;
  FILE* f = std::fopen(json_path.c_str(), "w");
  if (!f) throw std::runtime_error("cannot write " + json_path);
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    std::fprintf(f,
                 "  {\"op\": \"%s\", \"shape\": \"%s\", \"variant\": \"%s sm90a %s rotated\", \"median_us\": %.2f, "
                 "\"cv\": %.4f, \"gbps\": %.0f, \"pct_copy\": %.1f, \"copy_gbps\": %.0f, \"commit\": \"%s\", "
                 "\"gpu\": \"%s\"}%s\n",
                 r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.launch.c_str(), r.us, r.cv, r.gbps, r.pct, copy,
                 commit.c_str(), gpu, i + 1 < recs.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, commit = "unknown";
  bool quick = false, multi_query = false, mq_scorer = false, fp8 = false, index_only = false, trace = false;
  bool no_checks = false;
  bool attn_only = false;  // --fp8 --attn-only: the attention half only
  bool floors = false;     // --floors: the same-size read floors only
  std::vector<int> arg_batches, arg_ctxs, schedules = {0};  // --schedules 1,2: cluster and balanced
  auto int_list = [](const char* s) {
    std::vector<int> v;
    for (const char* p = s; *p;) {
      char* e = nullptr;
      const long x = std::strtol(p, &e, 10);
      if (e == p || x <= 0) throw std::invalid_argument(std::string("bench_decode: bad list ") + s);
      v.push_back(int(x));
      p = *e == ',' ? e + 1 : e;
    }
    return v;
  };
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a tee'd log even if a time limit ends the run
  try {
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--index-only")) index_only = true;
      if (!std::strcmp(argv[i], "--attn-only")) attn_only = true;
      if (!std::strcmp(argv[i], "--trace")) trace = true;
      if (!std::strcmp(argv[i], "--floors")) floors = true;
      if (!std::strcmp(argv[i], "--batches") && i + 1 < argc) arg_batches = int_list(argv[++i]);
      else if (!std::strcmp(argv[i], "--ctxs") && i + 1 < argc) arg_ctxs = int_list(argv[++i]);
      if (!std::strcmp(argv[i], "--multi-query")) multi_query = true;
      if (!std::strcmp(argv[i], "--mq-scorer")) mq_scorer = true;
      if (!std::strcmp(argv[i], "--fp8")) fp8 = true;
      if (!std::strcmp(argv[i], "--schedules") && i + 1 < argc) schedules = int_list(argv[++i]);
      if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
      else if (!std::strcmp(argv[i], "--commit") && i + 1 < argc) commit = argv[++i];
      else if (!std::strcmp(argv[i], "--quick")) quick = true;
      if (!std::strcmp(argv[i], "--no-checks")) no_checks = true;  // profilers: the first launches are the timed ones
    }
    if (m3::cuda::device_count() == 0) {
      std::printf("bench_decode: no CUDA device\n");
      return 0;
    }
    cudaDeviceProp prop;
    M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    // ---- correctness first --------------------------------------------------------------------------------------
    using namespace m3::decode_check;
    const std::vector<int32_t> mixed = {0, 5, 127, 128, 1000, 2047, 2048, 5000, 16383, 70000};
    auto wide_rows = [] {  // 40 rows × 4 KV heads > #SMs: the wide pipeline
      std::vector<int32_t> p;
      for (int i = 0; i < 40; ++i) p.push_back(97 + 173 * i);
      return p;
    };
    auto mq_many = [] {  // 40 requests × 4 KV heads > #SMs: no split, a second wave
      std::vector<int32_t> p;
      for (int i = 0; i < 40; ++i) p.push_back(2100 + 1733 * i);
      return p;
    };
    auto mq_many_q = [] {
      std::vector<int> q;
      for (int i = 0; i < 40; ++i) q.push_back(i % 2 ? 8 : 4);
      return q;
    };
    struct Check {
      const char* name;
      Result r;
    };
    std::vector<Check> checks;
    if (!fp8 && !index_only && !floors && !no_checks)  // --fp8: the e4m3 checks only (gpu_decode_test: the others)
      checks = {
        {"paged_decode_tc sparse G16 split", check_paged_decode(11, mixed, 4, 16, true, true)},
        {"paged_decode_tc sparse G16 nosplit", check_paged_decode(12, mixed, 4, 16, true, false)},
        {"paged_decode_tc sparse G8", check_paged_decode(13, mixed, 1, 8, true, true)},
        {"paged_decode_tc dense", check_paged_decode(14, {3, 300, 4000, 9000}, 4, 16, false, true)},
        {"paged_decode_tc sparse G16 wide", check_paged_decode(17, wide_rows(), 4, 16, true, true)},
        {"paged_decode_mq overlap split",
         check_paged_decode_mq(21, {3, 129, 130, 1000, 2050, 5000, 16383, 16385, 70000, 5121},
                               {1, 2, 4, 8, 3, 1, 2, 4, 8, 3}, 4, 16, MqSelection::kOverlap, true)},
        {"paged_decode_mq overlap nosplit",
         check_paged_decode_mq(22, {3, 129, 130, 1000, 2050, 5000, 16383, 16385, 70000, 5121},
                               {8, 4, 2, 1, 8, 4, 2, 1, 8, 4}, 4, 16, MqSelection::kOverlap, false)},
        {"paged_decode_mq random G16 split",
         check_paged_decode_mq(23, {3, 129, 130, 1000, 2050, 5000, 16383, 16385, 70000, 5121},
                               {1, 2, 4, 8, 3, 1, 2, 4, 8, 3}, 4, 16, MqSelection::kRandom, true)},
        {"paged_decode_mq random G8 Q8",
         check_paged_decode_mq(24, {130, 2050, 70000}, {8, 8, 8}, 1, 8, MqSelection::kRandom, true)},
        {"paged_decode_mq overlap 40 requests", check_paged_decode_mq(25, mq_many(), mq_many_q(), 4, 16,
                                                                       MqSelection::kOverlap, true)},
        {"paged_decode_mq dense Q8",
         check_paged_decode_mq(26, {5, 200, 1000, 1900}, {8, 8, 2, 8}, 4, 16, MqSelection::kDense, true)},
        {"paged_decode_mq dense Q4",
         check_paged_decode_mq(27, {100, 3000, 4000}, {4, 4, 4}, 4, 16, MqSelection::kDense, false)},
    };
    if ((!fp8 || index_only) && !floors && !no_checks) {
      std::vector<int32_t> many;  // several rows per CTA
      for (int i = 0; i < 300; ++i) many.push_back(2048 + 11 * i);
      checks.push_back({"msa_decode_index H4", check_decode_index(15, mixed, 4)});
      checks.push_back({"msa_decode_index H1", check_decode_index(16, {2100, 40000, 130000}, 1, 16, 1)});
      checks.push_back({"msa_decode_index B8 16k", check_decode_index(18, std::vector<int32_t>(8, 16383), 4)});
      checks.push_back({"msa_decode_index 300 short rows", check_decode_index(19, many, 4)});
      checks.push_back({"msa_decode_index ties period 5", check_decode_index_ties(20, {16383, 2100, 5000, 70000}, 4, 5)});
      checks.push_back({"msa_decode_index ties all equal", check_decode_index_ties(31, {16383, 40000}, 1, 1)});
    }
    bool all_ok = true;
    for (auto& c : checks) {
      std::printf("check %-36s max|err| %.3g / max|ref| %.3g (vs per-row %.3g)  %s %s\n", c.name, c.r.max_err,
                  c.r.max_ref, c.r.max_err_rowwise, c.r.bad ? "FAIL" : "ok", c.r.what.c_str());
      all_ok &= c.r.bad == 0;
    }
    if (!floors && !no_checks) all_ok &= fp8_checks(index_only);

    std::string copy_detail;
    const double copy = copy_ceiling_gbps(&copy_detail);
    std::printf("copy ceiling (read + write, best of): %.0f GB/s (%s)\n", copy, copy_detail.c_str());
    if (floors) {
      run_floors(copy, arg_batches.empty() ? std::vector<int>{1, 8, 32, 64} : arg_batches,
                 arg_ctxs.empty() ? std::vector<int>{16384, 65536} : arg_ctxs);
      return all_ok ? 0 : 1;
    }
    if (multi_query) return run_multi_query(copy, mq_scorer, json_path, commit, prop.name) && all_ok ? 0 : 1;
    if (fp8) {
      run_fp8(copy, json_path, commit, prop.name, arg_batches, arg_ctxs, index_only, trace, schedules, attn_only);
      return all_ok ? 0 : 1;
    }

    std::vector<int> batches = quick ? std::vector<int>{8, 64} : std::vector<int>{1, 8, 32, 64, 128};
    std::vector<int> ctxs =
        quick ? std::vector<int>{16384, 65536} : std::vector<int>{8192, 16384, 65536, 131072, 1048576};
    if (!arg_batches.empty()) batches = arg_batches;
    if (!arg_ctxs.empty()) ctxs = arg_ctxs;
    std::vector<Record> recs;

    // ---- index scorer + top-k + page list ----------------------------------------------------------------------
    const size_t pool_pages_max = size_t(32) << 30 >> 15;  // 32 GiB of 32 KiB index pages
    size_t need_max = 0;
    for (int B : batches)
      for (int ctx : ctxs) {
        const size_t pages = size_t(B) * (ctx / kBlock);
        const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / (pages * 32768.0)), 1, 64));
        need_max = std::max(need_max, pages * rot);
      }
    const size_t ipages = std::min(need_max + 16, pool_pages_max + 16);
    m3::cuda::DeviceBuffer<bf16> ipool(ipages * kBlock * kD);
    fill(ipool.get(), ipages * kBlock * kD, 1);
    std::mt19937_64 g(7);
    for (int B : batches)
      for (int ctx : ctxs) {
        const int local = (ctx - 1) / kBlock, npages = local + 1;
        const size_t pages = size_t(B) * npages;
        const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / (pages * 32768.0)), 1, 64));
        if (pages * rot > ipages) {
          std::printf("index B=%d ctx=%d: skipped (index pool too small)\n", B, ctx);
          continue;
        }
        std::vector<int32_t> pos(B, ctx - 1), seq(B), pti(B + 1);
        for (int b = 0; b < B; ++b) seq[b] = b, pti[b + 1] = pti[b] + npages;
        std::vector<int32_t> perm(pages * rot);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g);
        DevVec<int32_t> dpos(pos), dseq(seq), dpti(pti), dperm(perm);
        m3::cuda::DeviceBuffer<bf16> iq(size_t(rot) * B * kHidx * kD);
        fill(iq.get(), size_t(rot) * B * kHidx * kD, 2);
        std::vector<m3::cuda::DevStepRows> rows(rot);
        for (int r = 0; r < rot; ++r)
          rows[r] = {dpos.get(), dseq.get(), dpti.get(), dperm.get() + size_t(r) * pages, B};
        // One plan per rotated step: the plan holds the step's page list (work_pages).
        std::vector<m3::cuda::MsaDecodeIndex> ops(rot);
        for (int r = 0; r < rot; ++r) ops[r].plan(pos, rows[r], kHidx, kTopK, kHkv, nullptr);
        m3::cuda::DevPagedIndexKT<bf16> cache{ipool.get(), int64_t(kBlock) * kD};
        for (const bool pdl : {false, true}) {
          const Timing t = time_graph(
              [&](cudaStream_t s) {
                for (int r = 0; r < rot; ++r)
                  ops[r].run(iq.get() + size_t(r) * B * kHidx * kD, cache, rows[r], s, pdl);
              },
              rot);
          const double bytes = double(B) * ctx * kD * 2;
          const double gbps = bytes / (t.median_us * 1e3);
          char shape[64];
          std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=1", B, ctx / 1024);
          recs.push_back({"msa_decode_index", shape, pdl ? "graph+PDL" : "graph", t.median_us, gbps, 100 * gbps / copy,
                          t.cv, vllm_index(B, ctx)});
        }
      }
    ipool.reset();

    // ---- paged decode attention ----------------------------------------------------------------------------------
    const int P = index_only ? 0 : 16384;  // K and V pools [P, 4, 128, 128] bf16: 2 GiB each
    m3::cuda::DeviceBuffer<bf16> kpool(size_t(P) * kHkv * kBlock * kD), vpool(size_t(P) * kHkv * kBlock * kD);
    fill(kpool.get(), size_t(P) * kHkv * kBlock * kD, 3);
    fill(vpool.get(), size_t(P) * kHkv * kBlock * kD, 4);
    for (int B : batches)
      for (int ctx : ctxs) {
        if (index_only) break;
        const int local = (ctx - 1) / kBlock, n = std::min(kTopK, local + 1), R = B * kHkv;
        const double tokens = double(R) * ((n - 1) * kBlock + (ctx - 1) % kBlock + 1);
        const double bytes = tokens * kD * 2 * 2;
        const int rot = int(std::clamp<double>(std::ceil(2.5 * kL2Bytes / bytes), 1, 64));
        std::vector<int32_t> indptr(R + 1), last(R, (ctx - 1) % kBlock + 1), idx(size_t(rot) * R * n);
        for (int r = 0; r < R; ++r) indptr[r + 1] = indptr[r] + n;
        for (int q = 0; q < rot; ++q)
          for (int r = 0; r < R; ++r) {
            int32_t* row = idx.data() + (size_t(q) * R + r) * n;
            for (int s = 0; s < n; ++s) {
              int32_t p;
              do p = int32_t(g() % P);
              while (std::find(row, row + s, p * kHkv + r % kHkv) != row + s);
              row[s] = p * kHkv + r % kHkv;
            }
          }
        DevVec<int32_t> dind(indptr), dlast(last), didx(idx);
        m3::cuda::DeviceBuffer<bf16> q(size_t(rot) * R * kG * kD), out(size_t(rot) * R * kG * kD);
        fill(q.get(), size_t(rot) * R * kG * kD, 5);
        m3::cuda::PagedDecodeTc op;
        op.plan(R, kG, n, true);
        for (const bool pdl : {false, true}) {
          const Timing t = time_graph(
              [&](cudaStream_t s) {
                for (int r = 0; r < rot; ++r) {
                  m3::cuda::PagedDecodeTcArgs<bf16> a;
                  a.q = q.get() + size_t(r) * R * kG * kD, a.out = out.get() + size_t(r) * R * kG * kD;
                  a.k = kpool.get(), a.v = vpool.get(), a.stride_page = int64_t(kBlock) * kD, a.stride_tok = kD;
                  a.indptr = dind.get(), a.indices = didx.get() + size_t(r) * R * n, a.last_len = dlast.get();
                  a.R = R, a.G = kG, a.scale = 1.f / std::sqrt(float(kD));
                  op.run(a, s, pdl);
                }
              },
              rot);
          const double gbps = bytes / (t.median_us * 1e3);
          char shape[64];
          if (op.balanced())
            std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=1 balanced %s", B, ctx / 1024,
                          op.balanced_deep<bf16>() ? "deep" : "wide");
          else
            std::snprintf(shape, sizeof shape, "B=%d ctx=%dk Q=1 splits=%d %s", B, ctx / 1024, op.splits(),
                          op.deep() ? "deep" : "wide");
          recs.push_back({"paged_decode_tc", shape, pdl ? "graph+PDL" : "graph", t.median_us, gbps, 100 * gbps / copy,
                          t.cv, vllm_attention(B)});
        }
      }

    std::printf("\n| op | shape | launch | median µs | CV | GB/s | %% of copy | vLLM µs |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : recs)
      std::printf("| %s | %s | %s | %.1f | %.1f%% | %.0f | %.0f%% | %s |\n", r.op.c_str(), r.shape.c_str(),
                  r.variant.c_str(), r.us, 100 * r.cv, r.gbps, r.pct, fmt_anchor(r.vllm).c_str());
    if (!json_path.empty()) {
      FILE* f = std::fopen(json_path.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + json_path);
      std::fprintf(f, "[\n");
      for (size_t i = 0; i < recs.size(); ++i) {
        const auto& r = recs[i];
        std::fprintf(f,
                     "  {\"op\": \"%s\", \"shape\": \"%s\", \"variant\": \"bf16 sm90a %s rotated\", "
                     "\"median_us\": %.2f, \"cv\": %.4f, \"gbps\": %.0f, \"pct_copy\": %.1f, \"copy_gbps\": %.0f, "
                     "\"vllm_us\": %.1f, \"commit\": \"%s\", \"gpu\": \"%s\"}%s\n",
                     r.op.c_str(), r.shape.c_str(), r.variant.c_str(), r.us, r.cv, r.gbps, r.pct, copy, r.vllm,
                     commit.c_str(), prop.name, i + 1 < recs.size() ? "," : "");
      }
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 2;
  }
}
