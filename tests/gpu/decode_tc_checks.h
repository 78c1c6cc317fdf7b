// Correctness checks of the bf16 and e4m3 decode kernels (PagedDecodeTc, MsaDecodeIndex) against their CPU twins, shared by
// gpu_decode_test (gtest) and tools/bench_decode (which checks before it times). Implemented in a .cpp (C++20 for
// backend/cpu/cpu_ops.h) so that CUDA sources including this header stay C++17. Inputs: random bf16 values (never
// zero), a random non-contiguous page table per row, ragged positions; outputs poisoned before each run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m3::decode_check {

struct Result {
  double max_err = 0, max_ref = 0;  // worst |gpu − cpu| and max |cpu|
  int64_t bad = 0;                  // elements outside tolerance, unwritten, or contract violations
  double max_err_rowwise = 0;       // multi-query checks: worst |PagedDecodeMq − PagedDecodeTc (per row)|
  std::string what;                 // first failure
  void fail(const std::string& w) {
    if (bad++ == 0) what = w;
  }
};

// Attention: G query heads per KV head, Hkv KV heads, HND pools, sparse (random valid selection of top_k) or dense
// (all pages 0..local) page lists; PagedDecodeTc vs cpu::attention_sparse / attention_dense_causal. schedule: 0 the
// plan's choice, 1 cluster, 2 balanced (PagedDecodeTc::Schedule).
Result check_paged_decode(uint64_t seed, const std::vector<int32_t>& positions, int Hkv, int G, bool sparse,
                          bool allow_split, int top_k = 16, int schedule = 0);

// Multi-query attention (PagedDecodeMq): request n has qs[n] ≤ 8 rows at consecutive positions ending at
// last_pos[n], sharing the request's page table. Selections per (row, KV head): kOverlap — the rows keep one base
// set of top_k − 1 history blocks and each later row swaps 1–2 of them (a row past a page boundary also takes the
// previous local block), as verify rows do; kRandom — independent per row; kDense — all blocks 0..local (keep
// Q·(local + 1) ≤ 128). Rows with local + 1 ≤ top_k select 0..local, as MSA does. PagedDecodeMq vs
// cpu::attention_sparse, and vs PagedDecodeTc run on the same rows as independent fake requests.
enum class MqSelection { kOverlap, kRandom, kDense };
Result check_paged_decode_mq(uint64_t seed, const std::vector<int32_t>& last_pos, const std::vector<int>& qs, int Hkv,
                             int G, MqSelection sel, bool allow_split, int top_k = 16);

// Index scorer + top-k + page list: MsaDecodeIndex vs cpu::msa_block_scores and cpu::msa_topk. The selection must
// equal the CPU top-k of the GPU's own scores exactly; against the CPU top-k of the CPU scores a block may differ only
// as a near tie. Page list: CSR of n_valid, v = pt[sel]·ppu + h, last-page fill.
// radix_max: MsaDecodeIndex::set_radix_max (< 0: the default).
Result check_decode_index(uint64_t seed, const std::vector<int32_t>& positions, int H, int top_k = 16,
                          int64_t ppu = 4, int radix_max = -1);
// Exact ties: history block b of every row maps to the physical page of block b % period (the local block keeps its
// own page), so each (row, head) has only `period` distinct scores, bit-identical on the GPU, and the top-k must
// break the ties by the lower block id, as the CPU twin does.
Result check_decode_index_ties(uint64_t seed, const std::vector<int32_t>& positions, int H, int period,
                               int radix_max = -1);

// FP8 (e4m3) caches (issue 15 item 4): the same random inputs (every 7th value ×2^−8, so small and subnormal codes
// occur) quantised by cuda::kv_quantize_e4m3 with per-tensor scales amax/448 (checked byte for byte against
// cpu::kv_quantize_e4m3, sampled past the first 2^22 codes), the kernels' e4m3 instantiations against the CPU twins on the dequantised values with
// the bf16 checks' strictness (scores: 1e-5·max(1, |cpu|)). acc (optional) gets the accuracy cost against the bf16
// cache on the same data.
struct Fp8Accuracy {
  // attention: ‖out − ref‖ / ‖ref‖, ref = fp32 attention over the bf16 values (what a bf16 cache stores)
  double attn_rel_l2_fp8 = 0, attn_rel_l2_bf16 = 0, attn_rel_l2_fp8_vs_bf16 = 0;
  double attn_rel_l2_vs_twin = 0;  // e4m3 kernel vs its CPU twin on the dequantised values
  // scorer: ranked (row, head) pairs, share whose selection equals the bf16 cache's, share of selected blocks shared
  int64_t sel_rows = 0;
  double sel_identical = 0, sel_blocks_shared = 0;
};
Result check_paged_decode_fp8(uint64_t seed, const std::vector<int32_t>& positions, int Hkv, int G, bool sparse,
                              bool allow_split, Fp8Accuracy* acc = nullptr, int top_k = 16);
// scale ≤ 0: amax/448 of the keys; 1: MSA's unscaled e4m3 keys.
Result check_decode_index_fp8(uint64_t seed, const std::vector<int32_t>& positions, int H, Fp8Accuracy* acc = nullptr,
                              float scale = 0.f, int top_k = 16, int64_t ppu = 4);

}  // namespace m3::decode_check
