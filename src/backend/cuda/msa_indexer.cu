#include "backend/cuda/msa_indexer.cuh"

#include <algorithm>

namespace m3::cuda {

namespace {

constexpr int kRows = 64;    // (token, head) rows per tile: 16 thread rows × 4
constexpr int kKeys = 32;    // keys per shared-memory chunk: 16 thread columns × 2
constexpr int kThreads = 256;

// grid (tiles, col_groups); thread (ty, tx) = (tid / 16, tid % 16) owns rows ty·4 + a (a < 4) and keys tx·2 + c.
// smem: q rows [64, Di + 1] | key chunk [32, Di + 1] (padding keeps lanes on distinct banks).
template <typename CT>
__global__ void __launch_bounds__(kThreads) msa_scores_kernel(const float* __restrict__ iq, int H, int Di,
                                                              DevPagedIndexK cache, DevStepRows rows,
                                                              const MsaIndexer::Tile* __restrict__ tiles,
                                                              int64_t max_cols, float* __restrict__ scores) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* ks = qs + kRows * (Di + 1);
  const MsaIndexer::Tile tile = tiles[blockIdx.x];
  const int nrows = tile.n * H;  // row rr = (token t0 + rr / H, head rr % H)
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int T = rows.T, B = cache.block_size;
  for (int i = tid; i < kRows * Di; i += kThreads) {
    const int rr = i / Di, d = i % Di;
    qs[rr * (Di + 1) + d] = rr < nrows ? iq[(int64_t(tile.t0) + rr / H) * H * Di + (rr % H) * Di + d] : 0.f;
  }
  const int32_t* pt = rows.pt_pages + rows.pt_indptr[rows.row_seq[tile.t0]];
  for (int64_t b = blockIdx.y; b < max_cols; b += gridDim.y) {
    float run[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    if (b < tile.max_local) {  // uniform per CTA: some row of the tile ranks block b
      const CT* kp = static_cast<const CT*>(cache.ik) + int64_t(pt[b]) * cache.page_stride;
      for (int j0 = 0; j0 < B; j0 += kKeys) {
        const int nk = min(kKeys, B - j0);
        __syncthreads();  // q rows loaded / previous chunk consumed
        for (int i = tid; i < nk * Di; i += kThreads) {
          const int j = i / Di, d = i % Di;
          ks[j * (Di + 1) + d] = kv_load(kp + int64_t(j0 + j) * Di + d);
        }
        __syncthreads();
        float dot[4][2] = {};
        const float* q0 = qs + (ty * 4) * (Di + 1);
        const float* k0 = ks + (tx * 2) * (Di + 1);
        for (int d = 0; d < Di; ++d) {
          const float k_0 = k0[d], k_1 = k0[Di + 1 + d];
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            const float qv = q0[a * (Di + 1) + d];
            dot[a][0] += qv * k_0;
            dot[a][1] += qv * k_1;
          }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            if (tx * 2 + c < nk) run[a] = fmaxf(run[a], dot[a][c]);
      }
      // Max over the 16 threads sharing a row (consecutive lanes of one half-warp).
#pragma unroll
      for (int a = 0; a < 4; ++a)
        for (int o = 8; o > 0; o >>= 1) run[a] = fmaxf(run[a], __shfl_xor_sync(0xffffffffu, run[a], o));
    }
    if (tx == 0) {
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int rr = ty * 4 + a;
        if (rr >= nrows) continue;
        const int t = tile.t0 + rr / H, h = rr % H;
        const int64_t local = rows.pos[t] / B;
        scores[(int64_t(h) * T + t) * max_cols + b] = b < local ? run[a] : -INFINITY;
      }
    }
  }
}

// Decode-shaped tiles (≤ kDecRows = 32 (token, head) rows, e.g. Q ≤ 8 at 4 index heads): the generic kernel would
// leave most of its 64-row thread grid idle, so here all 256 threads work on keys: thread = (key kq = tid / 8,
// part = tid % 8); a part covers DPP = Di / 8 dimensions, read straight from global memory with 16-byte loads
// (8 consecutive lanes read one 4·Di-byte key row: coalesced). Partial dots are summed over the 8 lanes of a key
// with shuffles, the max over keys is reduced per warp and then across warps in shared memory.
// smem: q rows [kDecRows][8][DPP + 1] (padding: the 8 parts of a row sit on distinct banks) | per-warp maxima.
constexpr int kDecRows = 32;

template <int DPP, typename CT>
__global__ void __launch_bounds__(kThreads) msa_scores_decode_kernel(const float* __restrict__ iq, int H,
                                                                     DevPagedIndexK cache, DevStepRows rows,
                                                                     const MsaIndexer::Tile* __restrict__ tiles,
                                                                     int64_t max_cols, float* __restrict__ scores) {
  constexpr int Di = 8 * DPP;
  __shared__ float qs[kDecRows * 8 * (DPP + 1)];
  __shared__ float red[kThreads / 32][kDecRows];
  const MsaIndexer::Tile tile = tiles[blockIdx.x];
  const int nrows = tile.n * H;
  const int tid = threadIdx.x, kq = tid >> 3, part = tid & 7, lane = tid & 31, warp = tid >> 5;
  const int T = rows.T, B = cache.block_size;
  for (int i = tid; i < kDecRows * Di; i += kThreads) {
    const int rr = i / Di, d = i % Di;
    qs[rr * 8 * (DPP + 1) + (d / DPP) * (DPP + 1) + d % DPP] =
        rr < nrows ? iq[(int64_t(tile.t0) + rr / H) * H * Di + (rr % H) * Di + d] : 0.f;
  }
  __syncthreads();
  const int32_t* pt = rows.pt_pages + rows.pt_indptr[rows.row_seq[tile.t0]];
  for (int64_t b = blockIdx.y; b < max_cols; b += gridDim.y) {
    if (b >= tile.max_local) {  // no row ranks this block: just the −inf fill
      if (tid < nrows) {
        const int t = tile.t0 + tid / H, h = tid % H;
        scores[(int64_t(h) * T + t) * max_cols + b] = -INFINITY;
      }
      continue;
    }
    const CT* kp = static_cast<const CT*>(cache.ik) + int64_t(pt[b]) * cache.page_stride;
    float run[kDecRows];
#pragma unroll
    for (int r = 0; r < kDecRows; ++r) run[r] = -INFINITY;
    for (int j0 = 0; j0 < B; j0 += 32) {
      const int j = j0 + kq;
      float kv[DPP];
      if (j < B) {
        const CT* src = kp + int64_t(j) * Di + part * DPP;
#pragma unroll
        for (int i = 0; i < DPP / 4; ++i) {
          const float4 v = kv_load4(src + 4 * i);
          kv[4 * i] = v.x, kv[4 * i + 1] = v.y, kv[4 * i + 2] = v.z, kv[4 * i + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < DPP; ++i) kv[i] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < kDecRows; ++r) {
        if (r >= nrows) break;  // uniform across the CTA
        const float* qr = qs + r * 8 * (DPP + 1) + part * (DPP + 1);
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < DPP; ++i) dot += qr[i] * kv[i];
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        dot += __shfl_xor_sync(0xffffffffu, dot, 4);
        if (j < B) run[r] = fmaxf(run[r], dot);
      }
    }
#pragma unroll
    for (int r = 0; r < kDecRows; ++r) {
      if (r >= nrows) break;
      float v = fmaxf(run[r], __shfl_xor_sync(0xffffffffu, run[r], 8));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
      if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (tid < nrows) {
      float v = red[0][tid];
      for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, red[w][tid]);
      const int t = tile.t0 + tid / H, h = tid % H;
      const int64_t local = rows.pos[t] / B;
      scores[(int64_t(h) * T + t) * max_cols + b] = b < local ? v : -INFINITY;
    }
    __syncthreads();  // red[] is rewritten by the next block
  }
}

template <int DPP>
void launch_decode(dim3 grid, const float* iq, int H, const DevPagedIndexK& cache, const DevStepRows& rows,
                   const MsaIndexer::Tile* tiles, int64_t max_cols, float* scores, cudaStream_t s) {
  if (cache.type == KvType::BF16)
    msa_scores_decode_kernel<DPP, __nv_bfloat16><<<grid, kThreads, 0, s>>>(iq, H, cache, rows, tiles, max_cols, scores);
  else
    msa_scores_decode_kernel<DPP, float><<<grid, kThreads, 0, s>>>(iq, H, cache, rows, tiles, max_cols, scores);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void MsaIndexer::plan(const std::vector<int32_t>& pos, const std::vector<int32_t>& row_seq, int num_heads,
                      int block_size, bool decode, cudaStream_t s) {
  M3_CUDA_REQUIRE(num_heads >= 1 && num_heads <= kRows, "msa indexer: %d index heads (supported: 1..64)", num_heads);
  M3_CUDA_REQUIRE(pos.size() == row_seq.size(), "msa indexer: positions and row sequences differ in length");
  H_ = num_heads, B_ = block_size, T_ = int(pos.size());
  decode_ = decode && num_heads <= kDecRows;
  // Decode tiles hold ≤ 32 rows (Q ≤ 8 tokens at 4 heads) for the decode-shaped kernel.
  rows_per_tile_ = (decode_ ? kDecRows : kRows) / num_heads;
  h_tiles_.clear();
  max_cols_ = 1;
  for (int t = 0; t < T_;) {
    Tile tile{t, 0, 0, 0};
    while (t < T_ && tile.n < rows_per_tile_ && row_seq[t] == row_seq[tile.t0]) {
      tile.max_local = std::max(tile.max_local, pos[t] / block_size);
      ++tile.n, ++t;
    }
    max_cols_ = std::max<int64_t>(max_cols_, tile.max_local + 1);
    h_tiles_.push_back(tile);
  }
  upload(tiles_, h_tiles_.data(), h_tiles_.size(), s);
  // Enough CTAs to fill the GPU: prefill has many tiles; decode has few, so its blocks are spread further.
  const int64_t tiles = int64_t(h_tiles_.size());
  const int64_t want = decode ? 1056 : 264;
  col_groups_ = int(std::clamp<int64_t>((want + tiles - 1) / std::max<int64_t>(tiles, 1), 1, std::min<int64_t>(max_cols_, 65535)));
}

void MsaIndexer::run(const float* iq, const DevPagedIndexK& cache, const DevStepRows& rows, float* scores,
                     cudaStream_t s) {
  if (T_ == 0) return;
  M3_CUDA_REQUIRE(cache.block_size == B_ && rows.T == T_, "msa indexer: cache/rows do not match the plan");
  const int Di = cache.index_dim;
  M3_CUDA_REQUIRE(Di >= 1 && Di <= 256, "msa indexer: index dim %d (supported: 1..256)", Di);
  const dim3 grid(unsigned(h_tiles_.size()), unsigned(col_groups_));
  if (decode_ && Di % 32 == 0 && Di <= 256 && reinterpret_cast<uintptr_t>(cache.ik) % 16 == 0 &&
      cache.page_stride % 8 == 0) {
    switch (Di / 8) {
      case 4: return launch_decode<4>(grid, iq, H_, cache, rows, tiles_.get(), max_cols_, scores, s);
      case 8: return launch_decode<8>(grid, iq, H_, cache, rows, tiles_.get(), max_cols_, scores, s);
      case 16: return launch_decode<16>(grid, iq, H_, cache, rows, tiles_.get(), max_cols_, scores, s);
      case 32: return launch_decode<32>(grid, iq, H_, cache, rows, tiles_.get(), max_cols_, scores, s);
    }
  }
  const size_t smem = size_t(kRows + kKeys) * (Di + 1) * sizeof(float);
  // Once, for the largest index dim (256), so run() makes no attribute calls (capture-safe).
  const int max_smem = int(size_t(kRows + kKeys) * 257 * sizeof(float));
  static const cudaError_t attr_f = cudaFuncSetAttribute(msa_scores_kernel<float>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
  static const cudaError_t attr_b = cudaFuncSetAttribute(msa_scores_kernel<__nv_bfloat16>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
  M3_CUDA_CHECK(attr_f);
  M3_CUDA_CHECK(attr_b);
  if (cache.type == KvType::BF16)
    msa_scores_kernel<__nv_bfloat16><<<grid, kThreads, smem, s>>>(iq, H_, Di, cache, rows, tiles_.get(), max_cols_,
                                                                  scores);
  else
    msa_scores_kernel<float><<<grid, kThreads, smem, s>>>(iq, H_, Di, cache, rows, tiles_.get(), max_cols_, scores);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
