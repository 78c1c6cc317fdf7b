#include "model/rank_share.h"

#include "base/error.h"

namespace m3 {

void RankShare::validate(const M3Config& c) const {
  M3_CHECK(world >= 1 && rank >= 0 && rank < world, "rank share: rank {} of {} ranks", rank, world);
  M3_CHECK(attn_tp >= 1 && world % attn_tp == 0, "rank share: TP size {} must divide the {} ranks", attn_tp, world);
  M3_CHECK(c.num_kv_heads % attn_tp == 0, "rank share: TP over KV heads needs the {} KV heads to divide by {}",
           c.num_kv_heads, attn_tp);
  M3_CHECK(c.index_num_heads % attn_tp == 0,
           "rank share: TP over KV heads needs the {} index heads to divide by {}", c.index_num_heads, attn_tp);
  M3_CHECK(vocab_parts >= 1 && world % vocab_parts == 0 && vocab_parts <= c.vocab_size,
           "rank share: {} vocabulary parts for {} ranks and {} rows", vocab_parts, world, c.vocab_size);
}

}  // namespace m3
