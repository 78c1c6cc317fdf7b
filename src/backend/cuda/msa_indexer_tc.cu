// Tensor-core prefill indexer (msa_indexer_tc.cuh). CTA = one work item: a tile of 128 (token, head) rows of one
// sequence and a range of its history pages (all of them unless plan() split the tile), 384 threads: warpgroup 0's
// first thread streams the tile's q rows once ([128 rows, 64] × 2, 128B-swizzled TMA boxes) and then K of pages
// b0 .. b1 − 1 ([128 keys, 64] × 2 each) into a 4-stage ring; consumer warpgroups 1 and 2 (rows 0–63, 64–127) compute
// S = Q·Kᵀ (8 × wgmma m64n128k16) and reduce each row's 128 values to one max. Score mode: write scores[h, t, b] for
// the rows whose local block is after b (the other columns were set to −inf first). Fused mode: rank it into the
// row's running top-(K − 1) and write the selection, or a split's candidates for the merge kernel (§8.3 of
// docs/KERNELS.md).
#include "backend/cuda/msa_indexer_tc.cuh"

#include <algorithm>
#include <cmath>

#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"

namespace m3::cuda {
namespace {

using namespace hopper;

constexpr int kRows = 128, kDi = 128, kB = 128, kStages = 4, kThreads = 384;
constexpr uint32_t kAtom = 128 * 128;        // [128 rows, 64 bf16] 128B-swizzled: 16 KiB
constexpr uint32_t kStageBytes = 2 * kAtom;  // one index-K page [128 keys, 128]
constexpr size_t kSmem = 1024 + 2 * kAtom + kStages * kStageBytes + (2 * kStages + 1) * 8;
static_assert(kSmem <= 232448, "shared memory over the sm_90 per-block limit");

struct Cand {
  float key;
  int id;
};

struct Params {
  const MsaIndexerTc::Tile* tiles;
  const int32_t* pos;
  const int32_t* pt_indptr;
  const int32_t* pt_pages;
  float* scores;   // score mode: [H, T, max_cols]
  int32_t* sel;    // fused mode: [H, T, K]
  Cand* cand;      // fused mode, split tiles: [item][128 rows][16 slots]
  int T, H, K;
  int64_t max_cols;
};

__global__ void fill_neg_inf_kernel(float* p, int64_t n) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 3 < n) {
    *reinterpret_cast<float4*>(p + i) = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  } else {
    for (int64_t j = i; j < n; ++j) p[j] = -INFINITY;
  }
}

// Streaming top-(K − 1) of one query row over its history blocks (fused mode, K = top_k ≤ 16). The four lanes of a
// quad share the row (accumulator layout, hopper/wgmma.cuh); lane q holds slots q, q + 4, q + 8, q + 12. Slots ≥ K − 1
// are disabled (+inf, id −1: never the worst); free slots are (−inf, INT_MAX), which every block ranks before. All
// four lanes keep a copy of the worst slot (lowest key, then highest id), the only one a new block can replace.
// Blocks arrive in ascending id, so "ranks before the worst" (key desc, ties to the lower id, NaN as −inf) is
// exactly the cpu::msa_topk order restricted to the blocks seen so far.
struct RowTopK {
  float key[4];
  int id[4];
  float wkey;
  int wid, wslot;
};

__device__ __forceinline__ bool ranks_before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// Worst of the quad's slots; every lane of the warp must call it (shuffles over the quad).
__device__ __forceinline__ void find_worst(RowTopK& r, int q) {
  float wk = r.key[0];
  int wi = r.id[0], ws = q;
#pragma unroll
  for (int j = 1; j < 4; ++j)
    if (r.key[j] < wk || (r.key[j] == wk && r.id[j] > wi)) wk = r.key[j], wi = r.id[j], ws = q + 4 * j;
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    const float ok = __shfl_xor_sync(0xffffffffu, wk, x);
    const int oi = __shfl_xor_sync(0xffffffffu, wi, x), os = __shfl_xor_sync(0xffffffffu, ws, x);
    if (ok < wk || (ok == wk && (oi > wi || (oi == wi && os < ws)))) wk = ok, wi = oi, ws = os;
  }
  r.wkey = wk, r.wid = wi, r.wslot = ws;
}

__device__ __forceinline__ void topk_init(RowTopK& r, int q, int slots) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool on = q + 4 * j < slots;
    r.key[j] = on ? -INFINITY : INFINITY;
    r.id[j] = on ? 0x7fffffff : -1;
  }
  find_worst(r, q);
}

__device__ __forceinline__ void topk_replace(RowTopK& r, int q, float key, int id) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (r.wslot == q + 4 * j) r.key[j] = key, r.id[j] = id;
}

// Writes the row's selection (msa_topk contract): n = local + 1 ≤ K → 0..local then −1; else the K − 1 kept ids in
// ascending order (rank = how many kept ids are smaller), then local. Every lane of the warp must call it.
__device__ __forceinline__ void topk_write(const RowTopK& r, int q, int lane, bool active, int local, int K,
                                           int32_t* sel) {
  int all[16];
#pragma unroll
  for (int src = 0; src < 4; ++src)
#pragma unroll
    for (int j = 0; j < 4; ++j) all[src + 4 * j] = __shfl_sync(0xffffffffu, r.id[j], (lane & ~3) | src);
  if (!active) return;
  if (local + 1 <= K) {
    for (int i = q; i < K; i += 4) sel[i] = i <= local ? i : -1;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (q + 4 * j >= K - 1) continue;
    int rank = 0;
#pragma unroll
    for (int s = 0; s < 16; ++s) rank += (s < K - 1 && all[s] < r.id[j]);
    sel[rank] = r.id[j];
  }
  if (q == 0) sel[K - 1] = local;
}

// kSelect: fused top-k (selection only, no score matrix). kOverlap: two accumulator sets, so the MMAs of block
// blk + 1 run while the epilogue of block blk reduces and ranks (128 accumulator registers per thread).
template <bool kSelect, bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    msa_indexer_tc_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                          const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q_tile = smem;              // [2 boxes][128 rows][64]
  uint8_t* stages = smem + 2 * kAtom;  // [kStages][2 boxes][128 keys][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;

  const MsaIndexerTc::Tile tile = p.tiles[blockIdx.x];
  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each consumer warp
    }
    mbar_init(q_full, 1);
    fence_barrier_init();
  }
  __syncthreads();
  const int32_t* pt = p.pt_pages + p.pt_indptr[tile.seq];

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(q_full, 2 * kAtom);
      for (int b = 0; b < 2; ++b) tma_load_2d(q_tile + b * kAtom, &map_q, q_full, 64 * b, tile.t0 * p.H);
      PipeState<kStages> ps;
      for (int blk = tile.b0; blk < tile.b1; ++blk) {
        const int page = pt[blk];
        mbar_wait(&empty[ps.stage], ps.phase ^ 1u);
        mbar_arrive_expect_tx(&full[ps.stage], kStageBytes);
        uint8_t* st = stages + ps.stage * kStageBytes;
        for (int b = 0; b < 2; ++b) tma_load_3d(st + b * kAtom, &map_k, &full[ps.stage], 64 * b, 0, page);
        ps.advance();
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int c = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, q = lane % 4;
    // This thread's two rows (tile-local 64c + 16·warp + lane / 4, + 8): token, head, local block.
    const int r0 = 64 * c + 16 * warp + lane / 4, r1 = r0 + 8;
    const int tl0 = r0 / p.H, tl1 = r1 / p.H;
    const int t0 = tile.t0 + tl0, t1 = tile.t0 + tl1;
    const bool act0 = tl0 < tile.n, act1 = tl1 < tile.n;
    const int local0 = act0 ? p.pos[t0] / kB : 0, local1 = act1 ? p.pos[t1] / kB : 0;
    const int64_t o0 = int64_t(r0 % p.H) * p.T + t0, o1 = int64_t(r1 % p.H) * p.T + t1;  // (head, token) rows
    // Fused mode ranks only rows with more than K visible blocks (the others' selection is fixed).
    const int rank0 = local0 + 1 > p.K ? local0 : 0, rank1 = local1 + 1 > p.K ? local1 : 0;
    RowTopK tk0, tk1;
    if constexpr (kSelect) {
      topk_init(tk0, q, p.K - 1);
      topk_init(tk1, q, p.K - 1);
    }
    const uint64_t dq = smem_desc_sw128(q_tile + c * (64 * 128));
    mbar_wait(q_full, 0);

    auto issue = [&](float(&s)[64], PipeState<kStages>& ps) {
      mbar_wait(&full[ps.stage], ps.phase);
      const uint64_t dk = smem_desc_sw128(stages + ps.stage * kStageBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        Wgmma<bf16_t, 128>::mma_ss(s, desc_advance(dq, (kk / 4) * kAtom + (kk % 4) * 32),
                                   desc_advance(dk, (kk / 4) * kAtom + (kk % 4) * 32), kk > 0);
      wgmma_commit();
      ps.advance();
    };
    // Block blk's accumulators are final: release the stage, reduce each row to its max, store or rank it.
    auto epilogue = [&](float(&s)[64], PipeState<kStages>& rel, int blk) {
      fence_regs(s);
      if (lane == 0) mbar_arrive(&empty[rel.stage]);
      rel.advance();
      float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        if ((i / 2) % 2 == 0)
          m0 = fmaxf(m0, s[i]);
        else
          m1 = fmaxf(m1, s[i]);
      }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
      }
      if constexpr (kSelect) {
        if (isnan(m0)) m0 = -INFINITY;
        if (isnan(m1)) m1 = -INFINITY;
        const bool in0 = blk < rank0 && ranks_before(m0, blk, tk0.wkey, tk0.wid);
        const bool in1 = blk < rank1 && ranks_before(m1, blk, tk1.wkey, tk1.wid);
        if (__any_sync(0xffffffffu, in0 || in1)) {  // rare after the first blocks: one branch per warp
          if (in0) topk_replace(tk0, q, m0, blk);
          if (in1) topk_replace(tk1, q, m1, blk);
          find_worst(tk0, q);
          find_worst(tk1, q);
        }
      } else {
        if (q == 0) {
          if (blk < local0) p.scores[o0 * p.max_cols + blk] = m0;
          if (blk < local1) p.scores[o1 * p.max_cols + blk] = m1;
        }
      }
    };

    PipeState<kStages> rd, rel;
    const int b0 = tile.b0, n = tile.b1 - tile.b0;  // this item's pages b0 .. b1 − 1
    if constexpr (kOverlap) {
      float a0[64], a1[64];
      if (n > 0) {
        issue(a0, rd);
        int blk = 0;
        for (; blk + 2 < n; blk += 2) {  // steady state: a0 holds blk in flight
          issue(a1, rd);
          wgmma_wait<1>();
          epilogue(a0, rel, b0 + blk);
          issue(a0, rd);
          wgmma_wait<1>();
          epilogue(a1, rel, b0 + blk + 1);
        }
        if (blk + 1 < n) {  // two blocks left
          issue(a1, rd);
          wgmma_wait<1>();
          epilogue(a0, rel, b0 + blk);
          wgmma_wait<0>();
          epilogue(a1, rel, b0 + blk + 1);
        } else {
          wgmma_wait<0>();
          epilogue(a0, rel, b0 + blk);
        }
      }
    } else {
      for (int blk = 0; blk < n; ++blk) {
        float s[64];
        issue(s, rd);
        wgmma_wait<0>();
        epilogue(s, rel, b0 + blk);
      }
    }
    if constexpr (kSelect) {
      if (tile.cand < 0) {  // the whole history in this CTA: final selection
        topk_write(tk0, q, lane, act0, local0, p.K, p.sel + o0 * p.K);
        topk_write(tk1, q, lane, act1, local1, p.K, p.sel + o1 * p.K);
      } else {  // one split of the tile: its candidates, merged by msa_indexer_merge_kernel
        Cand* c0 = p.cand + (int64_t(tile.cand) * kRows + r0) * 16;
        Cand* c1 = p.cand + (int64_t(tile.cand) * kRows + r1) * 16;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          c0[q + 4 * j] = Cand{tk0.key[j], tk0.id[j]};
          c1[q + 4 * j] = Cand{tk1.key[j], tk1.id[j]};
        }
      }
    }
  }
}


// Merge of a split tile's candidates (one warp per (token, head) row): the rows' splits hold disjoint page ranges,
// each its own top-(K − 1) (free slots id INT_MAX, disabled slots id −1, skipped). K − 1 rounds pick the best
// candidate ranking after the previous pick (key desc, id asc: a total order, so no "taken" set), then the picks are
// written in ascending id order and the local block last; rows with local + 1 ≤ K get their fixed selection.
__global__ void __launch_bounds__(128) msa_indexer_merge_kernel(const MsaIndexerTc::MergeRow* __restrict__ rows,
                                                                int num_rows, const Cand* __restrict__ cand,
                                                                const int32_t* __restrict__ pos, int T, int K,
                                                                int32_t* __restrict__ selection) {
  const int w = int(blockIdx.x) * 4 + int(threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= num_rows) return;
  const MsaIndexerTc::MergeRow mr = rows[w];
  const int local = pos[mr.t] / kB;
  int32_t* sel = selection + (int64_t(mr.h) * T + mr.t) * K;
  if (local + 1 <= K) {
    for (int i = lane; i < K; i += 32) sel[i] = i <= local ? i : -1;
    return;
  }
  const Cand* c = cand + mr.cand;  // split j's 16 slots at c + j·kRows·16
  const int n = mr.splits * 16;
  float pk = INFINITY;
  int pb = -1, mine = -1;
  for (int k = 0; k < K - 1; ++k) {
    float bk = -INFINITY;
    int bb = 0x7fffffff;  // none yet
    for (int i = lane; i < n; i += 32) {
      const Cand x = c[int64_t(i / 16) * kRows * 16 + i % 16];
      if (x.id < 0 || x.id == 0x7fffffff) continue;
      if (!ranks_before(pk, pb, x.key, x.id) && k > 0) continue;
      if (bb == 0x7fffffff || ranks_before(x.key, x.id, bk, bb)) bk = x.key, bb = x.id;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
      const int ob = __shfl_xor_sync(0xffffffffu, bb, o);
      if (ob != 0x7fffffff && (bb == 0x7fffffff || ranks_before(ok, ob, bk, bb))) bk = ok, bb = ob;
    }
    pk = bk, pb = bb;
    if (lane == k) mine = bb;
  }
  int rank = 0;
  for (int m = 0; m < K - 1; ++m) rank += __shfl_sync(0xffffffffu, mine, m) < mine;
  if (lane < K - 1) sel[rank] = mine;
  if (lane == 0) sel[K - 1] = local;
}

}  // namespace

void MsaIndexerTc::plan(const std::vector<int32_t>& pos, const std::vector<int32_t>& row_seq, int num_heads,
                        int index_dim, int block_size, cudaStream_t s) {
  M3_CUDA_REQUIRE(index_dim == kDi && block_size == kB && num_heads >= 1 && num_heads <= kRows &&
                      kRows % num_heads == 0,
                  "MsaIndexerTc supports index dim 128, block 128 and index heads dividing 128 (got Di %d, B %d, "
                  "heads %d)",
                  index_dim, block_size, num_heads);
  M3_CUDA_REQUIRE(pos.size() == row_seq.size(), "MsaIndexerTc::plan: pos and row_seq differ in length");
  H_ = num_heads;
  T_ = int(pos.size());
  const int per = kRows / num_heads;  // tokens per tile
  std::vector<Tile> tiles;
  max_cols_ = 1;
  int64_t total_pages = 0;
  for (int t = 0; t < T_;) {
    Tile tl{t, 0, 0, row_seq[size_t(t)], 0, 0, -1};
    while (t < T_ && tl.n < per && row_seq[size_t(t)] == tl.seq) {
      tl.max_local = std::max(tl.max_local, pos[size_t(t)] / kB);
      ++tl.n, ++t;
    }
    max_cols_ = std::max<int64_t>(max_cols_, tl.max_local + 1);
    total_pages += tl.max_local;
    tiles.push_back(tl);
  }
  // Split the page range of long tiles when the step has too few pages per SM (few tokens, long context): a tile
  // is cut into items of ≥ kMinSplitPages pages so the grid fills the GPU; each item writes candidates, the merge
  // kernel ranks them. A step with ≥ one tile's pages per SM is not split (the merge would only add work).
  int ctas = target_ctas_;
  if (ctas <= 0) {
    static const int sms = [] {
      int dev = 0, n = 0;
      M3_CUDA_CHECK(cudaGetDevice(&dev));
      M3_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
      return std::max(n, 1);
    }();
    ctas = sms;
  }
  const int64_t chunk = std::max<int64_t>(kMinSplitPages, (total_pages + ctas - 1) / ctas);
  h_tiles_.clear();
  h_merge_.clear();
  int num_cand = 0;
  for (const Tile& tl : tiles) {
    const int splits = tl.max_local > chunk ? int(std::min<int64_t>((tl.max_local + chunk - 1) / chunk, kMaxSplits)) : 1;
    if (splits == 1) {
      Tile it = tl;
      it.b0 = 0, it.b1 = tl.max_local, it.cand = -1;
      h_tiles_.push_back(it);
      continue;
    }
    for (int j = 0; j < splits; ++j) {
      Tile it = tl;
      it.b0 = int(int64_t(tl.max_local) * j / splits), it.b1 = int(int64_t(tl.max_local) * (j + 1) / splits);
      it.cand = num_cand + j;
      h_tiles_.push_back(it);
    }
    for (int r = 0; r < tl.n * H_; ++r)
      h_merge_.push_back(MergeRow{tl.t0 + r / H_, r % H_, int64_t(num_cand) * kRows * 16 + int64_t(r) * 16, splits});
    num_cand += splits;
  }
  num_cand_ = num_cand;
  // Longest first: the last wave is made of short items.
  std::stable_sort(h_tiles_.begin(), h_tiles_.end(),
                   [](const Tile& a, const Tile& b) { return a.b1 - a.b0 > b.b1 - b.b0; });
  tiles_.grow(std::max<size_t>(h_tiles_.size(), 1));
  if (!h_tiles_.empty()) upload(tiles_, h_tiles_.data(), h_tiles_.size(), s);
  if (!h_merge_.empty()) {
    upload(merge_, h_merge_.data(), h_merge_.size(), s);
    cand_.grow(size_t(num_cand) * kRows * 16 * 2);  // (key, id) pairs
  }
}

namespace {

template <bool kSelect, bool kOverlap>
void launch(const uint16_t* iq, const uint16_t* ik, int64_t page_stride, int64_t num_pages, int T, int H,
            const Params& p, size_t num_tiles, cudaStream_t s) {
  static const bool configured = [] {
    M3_CUDA_CHECK(cudaFuncSetAttribute(msa_indexer_tc_kernel<kSelect, kOverlap>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  (void)configured;
  const CUtensorMap mq = make_tma_map_2d(iq, TmaDtype::BF16, uint64_t(T) * H, kDi, kDi, kRows, 64, TmaSwizzle::B128);
  const uint64_t kdims[3] = {uint64_t(kDi), uint64_t(kB), uint64_t(num_pages)};
  const uint64_t kstr[2] = {uint64_t(kDi), uint64_t(page_stride)};
  const uint32_t kbox[3] = {64, uint32_t(kB), 1};
  const CUtensorMap mk = make_tma_map_3d(ik, TmaDtype::BF16, kdims, kstr, kbox, TmaSwizzle::B128);
  msa_indexer_tc_kernel<kSelect, kOverlap><<<unsigned(num_tiles), kThreads, kSmem, s>>>(mq, mk, p);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void MsaIndexerTc::run(const uint16_t* iq, const uint16_t* ik, int64_t page_stride, int64_t num_pages,
                       const DevStepRows& rows, float* scores, cudaStream_t s) {
  M3_CUDA_REQUIRE(rows.T == T_, "MsaIndexerTc::run: %d rows, planned for %d", rows.T, T_);
  if (T_ == 0) return;
  const int64_t n = int64_t(H_) * T_ * max_cols_;
  fill_neg_inf_kernel<<<unsigned((n / 4 + 256) / 256), 256, 0, s>>>(scores, n);
  M3_CUDA_LAUNCH_CHECK();
  const Params p{tiles_.get(), rows.pos, rows.pt_indptr, rows.pt_pages, scores, nullptr, nullptr, T_, H_, 0, max_cols_};
  launch<false, false>(iq, ik, page_stride, num_pages, T_, H_, p, h_tiles_.size(), s);
}

void MsaIndexerTc::run_topk(const uint16_t* iq, const uint16_t* ik, int64_t page_stride, int64_t num_pages,
                            const DevStepRows& rows, int top_k, int32_t* selection, cudaStream_t s,
                            TopKPipeline pipeline) {
  M3_CUDA_REQUIRE(rows.T == T_, "MsaIndexerTc::run_topk: %d rows, planned for %d", rows.T, T_);
  M3_CUDA_REQUIRE(top_k >= 1 && top_k <= kMaxTopK, "MsaIndexerTc::run_topk: top_k %d (supported: 1..%d)", top_k,
                  kMaxTopK);
  if (T_ == 0) return;
  Cand* cand = reinterpret_cast<Cand*>(cand_.get());
  const Params p{tiles_.get(), rows.pos, rows.pt_indptr, rows.pt_pages, nullptr, selection, cand, T_, H_, top_k, max_cols_};
  if (pipeline == TopKPipeline::Overlap)
    launch<true, true>(iq, ik, page_stride, num_pages, T_, H_, p, h_tiles_.size(), s);
  else
    launch<true, false>(iq, ik, page_stride, num_pages, T_, H_, p, h_tiles_.size(), s);
  if (!h_merge_.empty()) {
    const int n = int(h_merge_.size());
    msa_indexer_merge_kernel<<<unsigned((n + 3) / 4), 128, 0, s>>>(merge_.get(), n, cand, rows.pos, T_, top_k,
                                                                    selection);
    M3_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace m3::cuda
