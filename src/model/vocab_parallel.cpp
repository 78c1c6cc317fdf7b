#include "model/vocab_parallel.h"

#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "base/error.h"

namespace m3 {

namespace {

void check_exchange(const ExpertParallel& ep, int64_t rows, const char* what) {
  M3_CHECK(ep.comm != nullptr && ep.max_tokens >= 1, "vocabulary parallel: no communicator or no token capacity");
  M3_CHECK(rows >= 0 && rows <= ep.max_tokens, "vocabulary parallel {}: {} rows in a step of at most {} per rank", what,
           rows, ep.max_tokens);
}

}  // namespace

void embed_vocab_parallel(const ExpertParallel& ep, const float* rows, int64_t v0, int64_t v1, int64_t V, int64_t H,
                          const int32_t* ids, int64_t T, float* x) {
  check_exchange(ep, T, "embedding");
  const int P = ep.comm->size();
  const int64_t Tm = ep.max_tokens;
  // One rank's block: [count][ids × Tm, −1 padded] as int32.
  std::vector<int32_t> send(size_t(Tm + 1), -1), all(size_t(P) * size_t(Tm + 1));
  send[0] = int32_t(T);
  for (int64_t t = 0; t < T; ++t) {
    M3_CHECK(ids[t] >= 0 && ids[t] < V, "vocabulary parallel embedding: token id {} outside [0, {})", ids[t], V);
    send[size_t(1 + t)] = ids[t];
  }
  ep.comm->all_gather(send.data(), send.size() * 4, all.data());
  // [P, Tm, H]: the rows this rank holds, for every rank's tokens.
  std::vector<float> part(size_t(P) * size_t(Tm * H), 0.f);
  for (int q = 0; q < P; ++q) {
    const int32_t* b = all.data() + size_t(q) * size_t(Tm + 1);
    for (int64_t t = 0; t < b[0]; ++t) {
      const int64_t id = b[1 + t];
      if (id >= v0 && id < v1)
        std::memcpy(&part[(size_t(q) * size_t(Tm) + size_t(t)) * size_t(H)], rows + (id - v0) * H, size_t(H) * 4);
    }
  }
  std::vector<float> mine(size_t(Tm * H));
  ep.comm->reduce_scatter_sum(part.data(), mine.data(), size_t(Tm * H));
  if (T) std::memcpy(x, mine.data(), size_t(T * H) * 4);
}

void lm_head_vocab_parallel(const ExpertParallel& ep, const float* rows, int64_t v0, int64_t v1, int64_t V,
                            int64_t H, const float* hn, int64_t n, float* logits) {
  check_exchange(ep, n, "LM head");
  const int P = ep.comm->size();
  const int64_t Tm = ep.max_tokens, Vr = v1 - v0;
  // One rank's block: [count as float (exact below 2^24)][hn × Tm·H, zero padded].
  const size_t block = 1 + size_t(Tm * H);
  std::vector<float> send(block, 0.f), all(size_t(P) * block);
  send[0] = float(n);
  if (n) std::memcpy(send.data() + 1, hn, size_t(n * H) * 4);
  ep.comm->all_gather(send.data(), block * 4, all.data());
  std::vector<float> part(size_t(P) * size_t(Tm * V), 0.f), slice;
  for (int q = 0; q < P; ++q) {
    const float* b = all.data() + size_t(q) * block;
    const int64_t nq = int64_t(b[0]);
    if (nq == 0 || Vr == 0) continue;
    slice.assign(size_t(nq * Vr), 0.f);
    cpu::matmul_nt(b + 1, nq, H, rows, Vr, slice.data());
    for (int64_t t = 0; t < nq; ++t)
      std::memcpy(&part[(size_t(q) * size_t(Tm) + size_t(t)) * size_t(V) + size_t(v0)], &slice[size_t(t * Vr)],
                  size_t(Vr) * 4);
  }
  std::vector<float> mine(size_t(Tm * V));
  ep.comm->reduce_scatter_sum(part.data(), mine.data(), size_t(Tm * V));
  if (n) std::memcpy(logits, mine.data(), size_t(n * V) * 4);
}

void embed_vocab_split_same_rows(const ExpertParallel& ep, const float* rows, int64_t v0, int64_t v1, int64_t V,
                                 int64_t H, const int32_t* ids, int64_t T, float* x) {
  M3_CHECK(ep.comm != nullptr, "vocabulary split: no communicator");
  std::memset(x, 0, size_t(T * H) * sizeof(float));
  for (int64_t t = 0; t < T; ++t) {
    M3_CHECK(ids[t] >= 0 && ids[t] < V, "vocabulary split embedding: token id {} outside [0, {})", ids[t], V);
    if (ids[t] >= v0 && ids[t] < v1) std::memcpy(x + t * H, rows + (ids[t] - v0) * H, size_t(H) * sizeof(float));
  }
  ep.comm->all_reduce_sum(x, size_t(T * H));  // one owner per row: the others add zeros
}

void lm_head_vocab_split_same_rows(const ExpertParallel& ep, const float* rows, int64_t V, int64_t H, const float* hn,
                                   int64_t n, float* logits) {
  M3_CHECK(ep.comm != nullptr, "vocabulary split: no communicator");
  const int P = ep.comm->size(), r = ep.comm->rank();
  const int64_t Vmax = (V + P - 1) / P;  // the widest range (RankShare::vocab_rows: V·q/P … V·(q+1)/P)
  const int64_t v0 = V * r / P, v1 = V * (r + 1) / P;
  std::vector<float> mine(size_t(n * (v1 - v0))), block(size_t(n * Vmax), 0.f), all(size_t(P) * size_t(n * Vmax));
  if (n > 0 && v1 > v0) cpu::matmul_nt(hn, n, H, rows, v1 - v0, mine.data());
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(&block[size_t(i * Vmax)], &mine[size_t(i * (v1 - v0))], size_t(v1 - v0) * sizeof(float));
  ep.comm->all_gather(block.data(), block.size() * sizeof(float), all.data());
  for (int q = 0; q < P; ++q) {
    const int64_t q0 = V * q / P, q1 = V * (q + 1) / P;
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(logits + i * V + q0, &all[size_t(q) * size_t(n * Vmax) + size_t(i * Vmax)],
                  size_t(q1 - q0) * sizeof(float));
  }
}

}  // namespace m3
