// Paged causal attention, dense and MSA-sparse (CPU reference). Both walk the visible keys of each query in
// ascending position order and use a two-pass softmax in fp32 (max, then exp-sum), so a query's output does not
// depend on which other queries share the call.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "base/thread_pool.h"

namespace m3::cpu {

namespace {

// Attends query vector q[D] to the keys of the listed logical blocks (ascending), keys j ≤ pos.
void attend_blocks(const float* q, int32_t pos, const PagedKV& kv, const int32_t* page_table, int kv_head,
                   const int32_t* blocks, int nblocks, float scale, float* out, std::vector<float>& scores) {
  const int B = kv.block_size, D = kv.head_dim;
  scores.clear();
  for (int bi = 0; bi < nblocks; ++bi) {
    const int32_t b = blocks[bi];
    const int64_t page = page_table[b];
    const float* kp = kv.k + page * kv.page_stride + int64_t(kv_head) * B * D;
    const int last = std::min<int>(B - 1, pos - b * B);
    for (int j = 0; j <= last; ++j) {
      const float* kr = kp + int64_t(j) * D;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot += q[d] * kr[d];
      scores.push_back(dot * scale);
    }
  }
  float m = -std::numeric_limits<float>::infinity();
  for (float s : scores) m = std::max(m, s);
  double denom = 0.0;
  for (float& s : scores) {
    s = std::exp(s - m);
    denom += s;
  }
  std::fill(out, out + D, 0.f);
  if (scores.empty()) return;
  const float inv = float(1.0 / denom);
  size_t idx = 0;
  for (int bi = 0; bi < nblocks; ++bi) {
    const int32_t b = blocks[bi];
    const int64_t page = page_table[b];
    const float* vp = kv.v + page * kv.page_stride + int64_t(kv_head) * B * D;
    const int last = std::min<int>(B - 1, pos - b * B);
    for (int j = 0; j <= last; ++j) {
      const float w = scores[idx++] * inv;
      const float* vr = vp + int64_t(j) * D;
      for (int d = 0; d < D; ++d) out[d] += w * vr[d];
    }
  }
}

}  // namespace

void attention_dense_causal(const float* q, int64_t Tq, int Hq, const int32_t* positions, const PagedKV& kv,
                            const int32_t* page_table, float scale, float* out) {
  const int G = Hq / kv.num_kv_heads, D = kv.head_dim;
  ThreadPool::global().parallel_for(Tq * Hq, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int32_t> blocks;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / Hq;
      const int m = int(r % Hq);
      const int32_t pos = positions[i];
      blocks.resize(pos / kv.block_size + 1);
      for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = int32_t(b);
      attend_blocks(q + r * D, pos, kv, page_table, m / G, blocks.data(), int(blocks.size()), scale, out + r * D,
                    scores);
    }
  });
}

void attention_sparse(const float* q, int64_t Tq, int Hq, const int32_t* positions, const PagedKV& kv,
                      const int32_t* page_table, const int32_t* selection, int top_k, float scale, float* out) {
  const int G = Hq / kv.num_kv_heads, D = kv.head_dim;
  ThreadPool::global().parallel_for(Tq * Hq, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int32_t> blocks;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / Hq;
      const int m = int(r % Hq), h = m / G;
      const int32_t* sel = selection + (int64_t(h) * Tq + i) * top_k;
      blocks.clear();
      for (int s = 0; s < top_k && sel[s] >= 0; ++s) blocks.push_back(sel[s]);
      std::sort(blocks.begin(), blocks.end());  // fixed summation order whatever the selection order
      attend_blocks(q + r * D, positions[i], kv, page_table, h, blocks.data(), int(blocks.size()), scale, out + r * D,
                    scores);
    }
  });
}

}  // namespace m3::cpu
