#include "model/executor_factory.h"

#include "base/error.h"
#include "model/checkpoint.h"
#ifdef M3_WITH_CUDA
#include "model/cuda_executor.h"
#endif

namespace m3 {

namespace {

// Pages for the budget in pages of `page_bytes`; 0 = the executor's default.
int32_t pages_for(const M3Config& c, const KvBudget& kv, int64_t page_bytes) {
  int64_t pages = 0;
  if (kv.bytes > 0) {
    pages = kv.bytes / page_bytes;
    M3_CHECK(pages >= 1, "KV cache memory of {} bytes holds no page (one page is {} bytes)", kv.bytes, page_bytes);
  } else if (kv.tokens > 0) {
    pages = (kv.tokens + c.sparse_block_size - 1) / c.sparse_block_size;
  }
  M3_CHECK(pages < (int64_t(1) << 31), "KV cache memory of {} bytes is too large", kv.bytes);
  return int32_t(pages);
}

}  // namespace

std::unique_ptr<ModelExecutor> make_executor(const std::string& model_dir, const std::string& device, KvBudget kv) {
  M3_CHECK(device == "auto" || device == "cpu" || device == "cuda", "--device must be auto, cpu or cuda, got '{}'",
           device);
#ifdef M3_WITH_CUDA
  const bool cuda = device == "cuda" || (device == "auto" && CudaExecutor::available());
  M3_CHECK(!cuda || CudaExecutor::available(), "--device cuda: no usable CUDA device");
#else
  M3_CHECK(device != "cuda", "--device cuda: this m3serve was built without CUDA (configure with -DM3_WITH_CUDA=ON)");
  [[maybe_unused]] const bool cuda = false;
#endif
  int32_t pages = 0;
  Checkpoint ck = load_checkpoint(model_dir, [&](const M3Config& c) {
#ifdef M3_WITH_CUDA
    if (cuda) {
      pages = pages_for(c, kv, CudaExecutor::page_bytes_for(c));
      return;
    }
#endif
    pages = pages_for(c, kv, CpuExecutor::page_bytes_for(c));
    if (pages == 0) pages = default_cpu_pages(c);
  });
#ifdef M3_WITH_CUDA
  if (cuda) return std::make_unique<CudaExecutor>(ck.config, ck.weights, pages);
#endif
  auto model = std::make_unique<M3Model>(std::move(ck.config), std::move(ck.weights));
  return std::make_unique<CpuExecutor>(std::move(model), pages);
}

}  // namespace m3
