#include "kv_accuracy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "base/dtype.h"
#include "base/error.h"
#include "io/safetensors.h"
#include "kv/sequence_kv.h"

namespace m3::kvacc {

namespace {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

}  // namespace

ScriptedRun run_scripted(const M3Model& model, const std::vector<int32_t>& ids, int64_t prefill, const KvStorage& st,
                         bool capture_queries) {
  const M3Config& c = model.config();
  const int64_t T = int64_t(ids.size()), B = c.sparse_block_size;
  M3_CHECK(prefill >= 1 && prefill <= T, "prefill {} outside [1, {}]", prefill, T);
  ScriptedRun r;
  r.cache = std::make_unique<KVCache>(c, int32_t((T + B - 1) / B));
  r.cache->set_storage(st);
  SequenceKV seq(*r.cache);
  seq.reserve(T);
  r.pages = seq.pages();
  if (capture_queries) {
    r.q.assign(c.num_layers, {});
    r.index_q.assign(c.num_layers, {});
  }
  ForwardTrace trace;
  trace.capture_sparse_queries = capture_queries;
  // Prefill of the first `prefill` tokens (logits for each), then teacher-forced one-token decode steps.
  for (int64_t s = 0; s < T;) {
    const int64_t len = s == 0 ? prefill : 1;
    SeqInput in{std::span<const int32_t>(ids.data() + s, size_t(len)), s, r.pages, true};
    auto out = model.forward(std::span<const SeqInput>(&in, 1), *r.cache, capture_queries ? &trace : nullptr);
    r.logits.insert(r.logits.end(), out[0].begin(), out[0].end());
    for (int l = 0; l < c.num_layers && capture_queries; ++l) {
      r.q[l].insert(r.q[l].end(), trace.q[l].begin(), trace.q[l].end());
      r.index_q[l].insert(r.index_q[l].end(), trace.index_q[l].begin(), trace.index_q[l].end());
    }
    s += len;
  }
  return r;
}

KvStorage calibrate_e4m3(const M3Model& model, const std::vector<int32_t>& warmup, bool ik_calibrated) {
  const M3Config& c = model.config();
  ScriptedRun w = run_scripted(model, warmup, int64_t(warmup.size()), KvStorage{});
  KvStorage st;
  st.dtype = st.index_dtype = KvDtype::E4M3;
  auto sc = [](float amax) { return amax > 0.f ? amax / 448.0f : 1.0f; };
  for (int l = 0; l < c.num_layers; ++l) {
    st.k_scale.push_back(sc(w.cache->write_stats(KvTensor::K, l).amax));
    st.v_scale.push_back(sc(w.cache->write_stats(KvTensor::V, l).amax));
    const bool sparse = c.attn_kinds[l] == AttnKind::Sparse;
    st.ik_scale.push_back(ik_calibrated && sparse ? sc(w.cache->write_stats(KvTensor::IndexK, l).amax) : 1.0f);
  }
  return st;
}

KvStorage scaled(KvStorage st, float f) {
  for (auto* v : {&st.k_scale, &st.v_scale, &st.ik_scale})
    for (float& x : *v) x *= f;
  return st;
}

LogitStats compare_logits(const std::vector<float>& a, const std::vector<float>& b, int64_t V, double gap_rel) {
  M3_CHECK(a.size() == b.size() && b.size() % size_t(V) == 0, "logit shapes differ");
  LogitStats s;
  std::vector<double> errs;
  for (size_t r = 0; r * size_t(V) < b.size(); ++r) {
    const float* ra = &a[r * V];
    const float* rb = &b[r * V];
    int64_t ia = 0, ib = 0;
    double mx = 1e-30, err = 0;
    for (int64_t j = 0; j < V; ++j) {
      if (ra[j] > ra[ia]) ia = j;
      if (rb[j] > rb[ib]) ib = j;
      mx = std::max(mx, double(std::fabs(rb[j])));
      err = std::max(err, double(std::fabs(ra[j] - rb[j])));
    }
    float second = -INFINITY;
    for (int64_t j = 0; j < V; ++j)
      if (j != ib) second = std::max(second, rb[j]);
    ++s.rows;
    s.agree += ia == ib;
    if (double(rb[ib] - second) >= gap_rel * mx) {
      ++s.decisive_rows;
      s.decisive_agree += ia == ib;
    }
    errs.push_back(err / mx);
  }
  s.err_p50 = quantile(errs, 0.5);
  s.err_p90 = quantile(errs, 0.9);
  s.err_max = errs.empty() ? 0 : *std::max_element(errs.begin(), errs.end());
  return s;
}

double SelectionStats::out_err_p50() const { return quantile(out_err, 0.5); }
double SelectionStats::out_err_max() const {
  return out_err.empty() ? 0 : *std::max_element(out_err.begin(), out_err.end());
}

SelectionStats compare_selections(const M3Model& model, const ScriptedRun& run, KvDtype a_dtype,
                                  const std::vector<float>& a_scale, KvDtype b_dtype,
                                  const std::vector<float>& b_scale) {
  const M3Config& c = model.config();
  const int64_t B = c.sparse_block_size, Di = c.index_head_dim, D = c.head_dim, K = c.sparse_topk_blocks;
  const int Hi = c.index_num_heads, Hq = c.num_q_heads, Hkv = c.num_kv_heads;
  M3_CHECK(Hi == Hkv, "selection heads {} != KV heads {}", Hi, Hkv);
  const int64_t T = int64_t(run.logits.size() / size_t(c.vocab_size));
  const int64_t P = run.cache->pool().capacity(), max_blocks = (T - 1) / B + 1;
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);
  const float scale = 1.0f / std::sqrt(float(D));
  SelectionStats s;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.attn_kinds[l] != AttnKind::Sparse) continue;
    M3_CHECK(run.index_q[l].size() == size_t(T * Hi * Di), "layer {}: run has no captured index queries", l);
    // Index-K of every page, rounded the two ways: [P, B, Di] (physical page order, the run's page table).
    std::vector<std::vector<int32_t>> sel(2, std::vector<int32_t>(size_t(Hi * T * K)));
    for (int side = 0; side < 2; ++side) {
      const KvDtype dt = side == 0 ? a_dtype : b_dtype;
      const std::vector<float>& scv = side == 0 ? a_scale : b_scale;
      const float sc = scv.empty() ? 1.0f : scv.at(size_t(l));
      std::vector<float> ik(size_t(P * B * Di));
      std::vector<uint8_t> codes(size_t(B * Di));
      for (int64_t p = 0; p < P; ++p) {
        const float* src = run.cache->index_k(int32_t(p), l);
        float* dst = &ik[p * B * Di];
        if (dt == KvDtype::F32) std::copy(src, src + B * Di, dst);
        if (dt == KvDtype::BF16)
          for (int64_t i = 0; i < B * Di; ++i) dst[i] = round_to_bf16(src[i]);
        if (dt == KvDtype::E4M3) {
          cpu::kv_quantize_e4m3(src, B * Di, sc, codes.data());
          cpu::kv_dequantize_e4m3(codes.data(), B * Di, sc, dst);
        }
      }
      const cpu::PagedIndexK view{ik.data(), B * Di, int(B), int(Di)};
      std::vector<float> scores(size_t(Hi * T * max_blocks));
      cpu::msa_block_scores(run.index_q[l].data(), T, Hi, pos.data(), view, run.pages.data(), max_blocks,
                            scores.data());
      cpu::msa_topk(scores.data(), T, Hi, pos.data(), int(B), max_blocks, int(K), sel[side].data());
    }
    // Attention of the fp32 run's queries over its K/V with either selection.
    const cpu::PagedKV kv = run.cache->layer_view(l);
    std::vector<float> oa(size_t(T * Hq * D)), ob(size_t(T * Hq * D));
    cpu::attention_sparse(run.q[l].data(), T, Hq, pos.data(), kv, run.pages.data(), sel[0].data(), int(K), scale,
                          oa.data());
    cpu::attention_sparse(run.q[l].data(), T, Hq, pos.data(), kv, run.pages.data(), sel[1].data(), int(K), scale,
                          ob.data());
    const int group = Hq / Hkv;
    for (int h = 0; h < Hi; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::set<int32_t> sa, sb;
        for (int64_t k = 0; k < K; ++k) {
          if (sel[0][(h * T + t) * K + k] >= 0) sa.insert(sel[0][(h * T + t) * K + k]);
          if (sel[1][(h * T + t) * K + k] >= 0) sb.insert(sel[1][(h * T + t) * K + k]);
        }
        const bool ranked = t / B + 1 > K;
        ++s.rows;
        s.identical += sa == sb;
        if (ranked) {
          ++s.ranked_rows;
          s.ranked_identical += sa == sb;
          for (int32_t blk : sb) {
            if (blk == t / B) continue;  // the local block is forced
            ++s.blocks;
            s.blocks_shared += sa.count(blk);
          }
        }
        if (sa == sb) continue;
        for (int m = h * group; m < (h + 1) * group; ++m) {
          double num = 0, den = 1e-30;
          for (int64_t d = 0; d < D; ++d) {
            const double x = oa[(t * Hq + m) * D + d], y = ob[(t * Hq + m) * D + d];
            num += (x - y) * (x - y);
            den += y * y;
          }
          s.out_err.push_back(std::sqrt(num / den));
        }
      }
  }
  return s;
}

std::vector<int32_t> fixture_ids(const std::string& dir) {
  SafeTensors gold = SafeTensors::open(dir + "/golden.safetensors");
  const TensorRef& t = gold.get("input_ids");
  std::vector<int32_t> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

}  // namespace m3::kvacc
