#include "model/executor_factory.h"

#include "base/error.h"
#include <filesystem>

#include "model/checkpoint.h"
#include "model/tp_executor.h"
#include "model/weight_plan.h"
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

std::unique_ptr<ModelExecutor> make_executor(const std::string& model_dir, const std::string& device, KvBudget kv,
                                             const LoadOptions& load) {
  namespace fs = std::filesystem;
  M3_CHECK(device == "auto" || device == "cpu" || device == "cuda", "--device must be auto, cpu or cuda, got '{}'",
           device);
#ifdef M3_WITH_CUDA
  const bool cuda = device == "cuda" || (device == "auto" && CudaExecutor::available());
  M3_CHECK(!cuda || CudaExecutor::available(), "--device cuda: no usable CUDA device");
#else
  M3_CHECK(device != "cuda", "--device cuda: this m3serve was built without CUDA (configure with -DM3_WITH_CUDA=ON)");
  [[maybe_unused]] const bool cuda = false;
#endif
  if (!cuda) check_cpu_load_options(load);
  check_kv_cache_options(load);
  M3_CHECK(fs::is_directory(model_dir), "model directory {} does not exist", model_dir);
  M3Config c = load_m3_config((fs::path(model_dir) / "config.json").string());
  if (load.num_layers > 0) c = truncate_layers(c, load.num_layers);
#ifdef M3_WITH_CUDA
  if (cuda) {
    CudaExecutorOptions o;
    o.bf16_weights = load.dtype != LoadDType::Float32;
    o.fp8_weights = load.dtype == LoadDType::Fp8;
    o.fp8_lt_min_rows = load.fp8_prefill_gemm == LoadFp8Gemm::W8A16 ? 0 : 16;
    o.attention = load.attention == LoadAttention::Dense   ? AttentionBackend::Dense
                  : load.attention == LoadAttention::MsaV1 ? AttentionBackend::MsaV1
                                                           : AttentionBackend::Msa;
    o.cuda_graphs = !load.enforce_eager;
    o.fp8_kv = load.kv_cache_dtype == LoadKvDtype::Fp8;
    const int32_t pages = pages_for(c, kv, CudaExecutor::page_bytes_for(c, o));
    if (load.dummy()) return CudaExecutor::dummy(c, load.dummy_seed, pages, o);
    return CudaExecutor::load(c, model_dir, pages, o);
  }
#endif
  const int tp = load.tensor_parallel_size;
  M3_CHECK(tp >= 1, "--tensor-parallel-size must be at least 1, got {}", tp);
  if (tp > 1) {
    // Attention split over KV heads: rank r reads only its share (its heads' q/k/v rows and o columns, and with
    // --enable-expert-parallel its routed experts e ≡ r mod N), and its range of the embedding and LM head rows (the
    // logits stay exact: model/vocab_parallel.h). --kv-cache-memory is per rank, in a rank's page size.
    M3_CHECK(!cuda, "--tensor-parallel-size {} runs on the CPU backend only so far (pass --device cpu)", tp);
    M3_CHECK(c.num_kv_heads % tp == 0 && c.index_num_heads % tp == 0,
             "--tensor-parallel-size {}: the model's {} KV heads and {} index heads must divide by it", tp,
             c.num_kv_heads, c.index_num_heads);
    RankShare layout{0, tp, /*expert_parallel=*/load.tensor_parallel_experts, /*attn_tp=*/tp, /*vocab_parts=*/tp};
    layout.validate(c);
    int32_t pages = pages_for(c, kv, CpuExecutor::page_bytes_for(layout.kv_config(c)));
    if (pages == 0) pages = default_cpu_pages(c);
    std::vector<std::unique_ptr<const M3Model>> models;
    for (int r = 0; r < tp; ++r) {
      RankShare share = layout;
      share.rank = r;
      M3Weights w = load.dummy() ? dummy_weights(c, load.dummy_seed, share)
                                 : M3Weights::load(c, SafeTensors::open(model_dir), share);
      models.push_back(std::make_unique<M3Model>(c, std::move(w)));
    }
    return std::make_unique<TpCpuExecutor>(std::move(models), pages);
  }
  int32_t pages = pages_for(c, kv, CpuExecutor::page_bytes_for(c));
  if (pages == 0) pages = default_cpu_pages(c);
  M3Weights w = load.dummy() ? dummy_weights(c, load.dummy_seed) : M3Weights::load(c, SafeTensors::open(model_dir));
  auto model = std::make_unique<M3Model>(std::move(c), std::move(w));
  return std::make_unique<CpuExecutor>(std::move(model), pages);
}

}  // namespace m3
