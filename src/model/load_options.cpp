#include "model/load_options.h"

#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"

namespace m3 {
namespace {

// A validator that maps the accepted words to the enum's number (which CLI11 then converts) and otherwise fails
// with the accepted words only (CLI11's CheckedTransformer prints its internal numbers, `{auto->0,...}`).
template <typename E>
CLI::Validator choice_of(const std::map<std::string, E>& words) {
  std::string list;
  for (const auto& [w, v] : words) list += (list.empty() ? "" : ", ") + w;
  return CLI::Validator(
      [words, list](std::string& s) -> std::string {
        const auto it = words.find(s);
        if (it == words.end()) return "'" + s + "' is not one of: " + list;
        s = std::to_string(static_cast<int>(it->second));
        return {};
      },
      "{" + list + "}");
}

}  // namespace

void add_load_flags(CLI::App& cmd, LoadOptions& o) {
  const std::map<std::string, LoadDType> dtypes{
      {"auto", LoadDType::Auto}, {"bfloat16", LoadDType::BFloat16}, {"float32", LoadDType::Float32},
      {"fp8", LoadDType::Fp8}};
  const std::map<std::string, LoadFormat> formats{
      {"auto", LoadFormat::Auto}, {"safetensors", LoadFormat::Safetensors}, {"dummy", LoadFormat::Dummy}};
  const std::map<std::string, LoadAttention> attns{
      {"msa", LoadAttention::Msa}, {"msa-v1", LoadAttention::MsaV1}, {"dense", LoadAttention::Dense}};
  cmd.add_option("--dtype", o.dtype,
                 "Weights and KV cache: auto (bfloat16 on CUDA, float32 on the CPU), bfloat16, float32 or fp8 "
                 "(CUDA: the MXFP8 attention, index, dense-MLP and shared-expert matrices stay e4m3, the rest and "
                 "the KV cache bfloat16)")
      ->transform(choice_of(dtypes));
  cmd.add_option("--load-format", o.load_format,
                 "auto/safetensors (the checkpoint) or dummy (random weights of the config's shapes, made on the "
                 "device; config.json is still read)")
      ->transform(choice_of(formats));
  cmd.add_option("--num-layers", o.num_layers,
                 "Build only the config's first N layers plus the head (0 = all), keeping their dense/MSA/MoE kinds")
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_option("--attention", o.attention,
                 "Attention of the MSA layers (CUDA): msa (tensor-core kernels where they apply), msa-v1 (the "
                 "query-major kernels) or dense (dense causal attention, a benchmark baseline)")
      ->transform(choice_of(attns));
  const std::map<std::string, LoadFp8Gemm> fp8_gemms{{"cublaslt", LoadFp8Gemm::CublasLt}, {"w8a16", LoadFp8Gemm::W8A16}};
  cmd.add_option("--fp8-prefill-gemm", o.fp8_prefill_gemm,
                 "With --dtype fp8: the GEMMs of prefill-sized steps (projections from 16 rows, MoE experts from "
                 "16 rows per expert): cublaslt (FP8xFP8, e4m3 activations: faster, less accurate; the MoE on "
                 "m3serve's own e4m3 wgmma GEMMs) or w8a16 (bf16/f16 activations, as the decode rows)")
      ->transform(choice_of(fp8_gemms));
  const std::map<std::string, LoadKvDtype> kv_dtypes{
      {"auto", LoadKvDtype::Auto}, {"fp8", LoadKvDtype::Fp8}, {"fp8_e4m3", LoadKvDtype::Fp8}};
  cmd.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "KV cache element type (CUDA): auto (the model dtype: bfloat16, float32 with --dtype float32) or "
                 "fp8 / fp8_e4m3 (K, V and index-K as e4m3 with per-tensor scales 1.0: twice the tokens per byte)")
      ->transform(choice_of(kv_dtypes));
  cmd.add_flag("--enforce-eager", o.enforce_eager,
               "Run every step eagerly (CUDA only; default: decode steps of up to 256 sequences replay CUDA graphs)");
}

const char* name(LoadDType d) {
  switch (d) {
    case LoadDType::BFloat16: return "bfloat16";
    case LoadDType::Float32: return "float32";
    case LoadDType::Fp8: return "fp8";
    default: return "auto";
  }
}
const char* name(LoadFormat f) {
  switch (f) {
    case LoadFormat::Safetensors: return "safetensors";
    case LoadFormat::Dummy: return "dummy";
    default: return "auto";
  }
}
const char* name(LoadFp8Gemm g) { return g == LoadFp8Gemm::W8A16 ? "w8a16" : "cublaslt"; }
const char* name(LoadKvDtype d) { return d == LoadKvDtype::Fp8 ? "fp8" : "auto"; }
const char* name(LoadAttention a) {
  switch (a) {
    case LoadAttention::MsaV1: return "msa-v1";
    case LoadAttention::Dense: return "dense";
    default: return "msa";
  }
}

void check_cpu_load_options(const LoadOptions& o) {
  M3_CHECK(o.dtype != LoadDType::BFloat16 && o.dtype != LoadDType::Fp8,
           "--dtype {} needs --device cuda: the CPU executor computes in float32 only", name(o.dtype));
  M3_CHECK(o.attention == LoadAttention::Msa,
           "--attention {} needs --device cuda: the CPU executor runs the model's own MSA attention only",
           name(o.attention));
  M3_CHECK(o.kv_cache_dtype == LoadKvDtype::Auto,
           "--kv-cache-dtype {} needs --device cuda: the CPU executor's cache is float32", name(o.kv_cache_dtype));
}

void check_kv_cache_options(const LoadOptions& o) {
  if (o.kv_cache_dtype != LoadKvDtype::Fp8) return;
  M3_CHECK(o.dtype != LoadDType::Float32,
           "--kv-cache-dtype fp8 does not run with --dtype float32 (the exact verification path keeps a float32 "
           "cache); use --dtype auto, bfloat16 or fp8");
  M3_CHECK(o.attention != LoadAttention::MsaV1,
           "--kv-cache-dtype fp8 does not run with --attention msa-v1 (the v1 kernels read float32 / bfloat16 "
           "caches only); use --attention msa or dense");
}

}  // namespace m3
