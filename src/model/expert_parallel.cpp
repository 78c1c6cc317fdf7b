#include "model/expert_parallel.h"

#include <cstring>

#include "base/error.h"

namespace m3 {

void moe_slots_expert_parallel(const ExpertParallel& ep, int64_t E, int64_t top_k, int64_t H, const float* xn,
                               int64_t T, const int32_t* ids, const RunExpert& run_expert, float* slot_out) {
  M3_CHECK(ep.comm != nullptr && ep.max_tokens >= 1, "expert parallel: no communicator or no token capacity");
  M3_CHECK(T >= 0 && T <= ep.max_tokens, "expert parallel: {} tokens in a step of at most {} per rank", T,
           ep.max_tokens);
  const int P = ep.comm->size();
  const int64_t Tm = ep.max_tokens, S = Tm * top_k;  // slots per rank
  // One rank's block: [int64 T][int32 ids × S, −1 padded][float xn × Tm·H, zero padded].
  const size_t ids_at = 8, xn_at = ids_at + size_t(S) * 4, block = xn_at + size_t(Tm * H) * 4;
  std::vector<uint8_t> send(block, 0), all(block * size_t(P));
  std::memcpy(send.data(), &T, 8);
  std::vector<int32_t> pad(size_t(S), -1);
  if (T) std::memcpy(pad.data(), ids, size_t(T * top_k) * 4);
  std::memcpy(send.data() + ids_at, pad.data(), size_t(S) * 4);
  if (T) std::memcpy(send.data() + xn_at, xn, size_t(T * H) * 4);
  ep.comm->all_gather(send.data(), block, all.data());

  // Per-slot outputs for every rank's slots routed to this rank's experts; zeros elsewhere.
  std::vector<float> out(size_t(P) * size_t(S * H), 0.f);
  for (int64_t e = 0; e < E; ++e) {
    if (!ep.owns(e)) continue;
    std::vector<int64_t> rows;  // q·S + slot, in rank then slot order
    for (int q = 0; q < P; ++q) {
      const uint8_t* b = all.data() + size_t(q) * block;
      int64_t Tq = 0;
      std::memcpy(&Tq, b, 8);
      const int32_t* qi = reinterpret_cast<const int32_t*>(b + ids_at);
      for (int64_t r = 0; r < Tq * top_k; ++r)
        if (qi[r] == e) rows.push_back(int64_t(q) * S + r);
    }
    if (rows.empty()) continue;
    std::vector<float> xe(rows.size() * size_t(H));
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t q = rows[i] / S, slot = rows[i] % S;
      const float* src = reinterpret_cast<const float*>(all.data() + size_t(q) * block + xn_at) + (slot / top_k) * H;
      std::memcpy(&xe[i * size_t(H)], src, size_t(H) * 4);
    }
    const std::vector<float> ye = run_expert(e, xe.data(), int64_t(rows.size()));
    M3_CHECK(ye.size() == xe.size(), "expert parallel: expert {} returned {} values for {} rows", e, ye.size(),
             rows.size());
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&out[size_t(rows[i] * H)], &ye[i * size_t(H)], size_t(H) * 4);
  }
  std::vector<float> mine(size_t(S * H));
  ep.comm->reduce_scatter_sum(out.data(), mine.data(), size_t(S * H));
  if (T) std::memcpy(slot_out, mine.data(), size_t(T * top_k * H) * 4);
}

}  // namespace m3
