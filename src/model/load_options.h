// How a model is loaded, shared by the `serve`, `generate` and `score` subcommands (issue 9 item 5), in the spirit of
// vLLM's --dtype / --load-format: the compute dtype of the weights (and with it the KV cache), where the weights come
// from (the checkpoint's safetensors, or random values of the right shapes made on the device), how many of the
// config's layers to build, and which attention kernels the MSA layers run.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace m3 {

// auto: bf16 on CUDA, fp32 on the CPU (its only dtype). fp8 (CUDA): the MXFP8 projection matrices stay FP8, the rest
// bf16 (CudaExecutorOptions::fp8_weights, docs/FP8.md §6).
enum class LoadDType { Auto, BFloat16, Float32, Fp8 };
enum class LoadFormat { Auto, Safetensors, Dummy };  // auto = safetensors
enum class LoadAttention { Msa, MsaV1, Dense };      // maps to CudaExecutorOptions::attention (AttentionBackend)
// --dtype fp8: the GEMM of the FP8 projections for prefill-sized steps (≥ 16 rows; decode rows always run W8A16).
// cublaslt: FP8×FP8 with e4m3 activations (faster, less accurate: docs/FP8.md §3, §6); w8a16: bf16 activations.
enum class LoadFp8Gemm { CublasLt, W8A16 };
// --kv-cache-dtype (as vLLM's): auto = the model dtype's cache (bf16 on CUDA, fp32 with --dtype float32 and on the
// CPU); fp8 (= fp8_e4m3, CUDA): K/V and index-K pools of e4m3 codes with per-tensor fp32 scales, 1.0 until
// calibrated (CudaExecutorOptions::fp8_kv, docs/FP8.md §8.2).
enum class LoadKvDtype { Auto, Fp8 };

struct LoadOptions {
  LoadDType dtype = LoadDType::Auto;
  LoadFormat load_format = LoadFormat::Auto;
  int num_layers = 0;  // 0 = all of the config's layers; else its first N (io/config.h truncate_layers)
  LoadAttention attention = LoadAttention::Msa;
  uint64_t dummy_seed = 0;  // seed of the dummy weights (src/base/counter_hash.h)
  bool enforce_eager = false;  // CUDA: no decode graphs (CudaExecutorOptions::cuda_graphs = false)
  LoadFp8Gemm fp8_prefill_gemm = LoadFp8Gemm::CublasLt;  // CudaExecutorOptions::fp8_lt_min_rows (16 or 0)
  LoadKvDtype kv_cache_dtype = LoadKvDtype::Auto;        // CudaExecutorOptions::fp8_kv
  // --tensor-parallel-size: attention split over this many KV-head ranks (CPU: TpCpuExecutor; each rank loads its
  // share, model/rank_share.h). Set by app::apply_parallel_options, not by add_load_flags.
  int tensor_parallel_size = 1;
  bool tensor_parallel_experts = false;  // with it: routed expert e on rank e mod tensor_parallel_size

  bool dummy() const { return load_format == LoadFormat::Dummy; }
};

// Adds --dtype, --load-format, --num-layers, --attention, --enforce-eager, --fp8-prefill-gemm and --kv-cache-dtype to
// a subcommand.
// Bad values fail at parse time with CLI11's message (exit code ≠ 0, no crash); the device-dependent checks (CPU
// refuses bfloat16, fp8 and the non-msa attention backends) happen in make_executor (model/executor_factory.h).
void add_load_flags(CLI::App& cmd, LoadOptions& o);

const char* name(LoadDType d);
const char* name(LoadFormat f);
const char* name(LoadAttention a);
const char* name(LoadFp8Gemm g);
const char* name(LoadKvDtype d);

// Throws m3::Error naming the flag when the options cannot run on the CPU executor.
void check_cpu_load_options(const LoadOptions& o);
// Throws m3::Error naming the flags when --kv-cache-dtype fp8 meets an option it cannot run with on CUDA: --dtype
// float32 (the exact verification path keeps an fp32 cache) or --attention msa-v1 (the v1 kernels read fp32 / bf16
// caches only). The shape checks (head dim 128, 128-token pages, …) are the executor's.
void check_kv_cache_options(const LoadOptions& o);

}  // namespace m3
