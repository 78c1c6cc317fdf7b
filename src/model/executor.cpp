#include "model/executor.h"

#include <fmt/format.h>

namespace m3 {

std::string CpuExecutor::describe() const {
  const M3Config& c = model_.config();
  const double mib = double(KVCache::page_floats(c)) * 4.0 * cache_.pool().capacity() / (1 << 20);
  return fmt::format("cpu fp32, KV cache {} pages × {} tokens = {} tokens ({:.1f} MiB)", cache_.pool().capacity(),
                     c.sparse_block_size, int64_t(cache_.pool().capacity()) * c.sparse_block_size, mib);
}

}  // namespace m3
