// Accuracy of the FP8 conversions against exact MXFP8 dequantisation (issue 15 item 1, docs/FP8.md), on the CPU
// twins of backend/cpu/fp8.h:
//   - MXFP8 (one UE8M0 scale per 32) → Row128 (one power-of-two scale per 1×128) and Blk128 (per 128×128): the
//     weights' relative Frobenius error, the largest error relative to max|W|, the share of values changed and of
//     non-zero values flushed to zero, and the error of y = x·Wᵀ (16 activation rows) relative to ‖y‖;
//   - the 1×128 e4m3 activation quantisation of the FP8×FP8 GEMM, on the same products;
//   - for context, what MXFP8 itself costs against the fp32 weights it was made from;
//   - through the whole CPU model, when the checkpoint directory has a golden.safetensors (tests/golden): the logits
//     with every MXFP8 matrix requantised, against the HF reference and against the exact-MXFP8 model (the
//     1×128 e4m3 activation quantisation of the prefill GEMM emulated through a cpu::matmul_nt input hook).
// Weight distributions: synthetic at M3's hidden size (see kDists) and every MXFP8 tensor of a checkpoint
// (--checkpoint DIR, e.g. tests/golden/fixtures/tiny_sparse_mxfp8).
//   fp8_accuracy [--checkpoint DIR] [--rows N] [--seed S]        prints markdown tables
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "base/dtype.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "kv/sequence_kv.h"
#include "model/m3_model.h"
#include "model/weight_plan.h"
#include "requant_slot.h"

namespace {

using namespace m3;

struct Err {
  double fro = 0, max_rel = 0, changed = 0, flushed = 0, y_rel = 0, y_max_rel = 0;
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += double(a[i] - ref[i]) * (a[i] - ref[i]), den += double(ref[i]) * ref[i];
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
double rel_max(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num = std::max(num, double(std::fabs(a[i] - ref[i]))), den = std::max(den, double(std::fabs(ref[i])));
  return den > 0 ? num / den : num;
}

// Activations like a transformer's normed hidden states: N(0, 1) per channel, 0.5 % of the channels ×20.
std::vector<float> activations(int64_t T, int64_t K, std::mt19937_64& g) {
  std::normal_distribution<float> d;
  std::vector<float> chan(size_t(K), 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& c : chan) c = u(g) < 0.005f ? 20.f : 1.f;
  std::vector<float> x(size_t(T * K));
  for (int64_t i = 0; i < T * K; ++i) x[size_t(i)] = round_to_bf16(d(g) * chan[size_t(i % K)]);
  return x;
}

std::vector<float> gemm(const std::vector<float>& x, int64_t T, int64_t K, const std::vector<float>& W, int64_t N) {
  std::vector<float> y(size_t(T * N));
  cpu::matmul_nt(x.data(), T, K, W.data(), N, y.data());
  return y;
}

// Requantises MX (q, s) to `fmt` and measures it against the exact MX dequantisation `Wmx`.
Err requant_error(const std::vector<uint8_t>& q, const std::vector<uint8_t>& s, int64_t N, int64_t K, Fp8Scale fmt,
                  const std::vector<float>& Wmx, const std::vector<float>& x, int64_t T, const std::vector<float>& ymx) {
  std::vector<uint8_t> q2(q.size());
  std::vector<float> s2(size_t(fp8_scale_count(fmt, N, K)));
  cpu::fp8_requant_from_mx(q.data(), s.data(), N, K, fmt, q2.data(), s2.data());
  std::vector<float> W2(Wmx.size());
  cpu::fp8_dequant(q2.data(), s2.data(), fmt, N, K, W2.data());
  Err e;
  e.fro = rel_l2(W2, Wmx);
  e.max_rel = rel_max(W2, Wmx);
  size_t changed = 0, flushed = 0, nonzero = 0;
  for (size_t i = 0; i < W2.size(); ++i) {
    changed += W2[i] != Wmx[i];
    nonzero += Wmx[i] != 0.f;
    flushed += Wmx[i] != 0.f && W2[i] == 0.f;
  }
  e.changed = double(changed) / double(W2.size());
  e.flushed = nonzero ? double(flushed) / double(nonzero) : 0.0;
  if (T > 0) {
    const auto y2 = gemm(x, T, K, W2, N);
    e.y_rel = rel_l2(y2, ymx);
    e.y_max_rel = rel_max(y2, ymx);
  }
  return e;
}

// y with the activations quantised to e4m3 1×128 (weights exact MX), against y with bf16 activations.
double act_quant_error(const std::vector<float>& x, int64_t T, int64_t K, const std::vector<float>& Wmx, int64_t N,
                       const std::vector<float>& ymx) {
  std::vector<uint8_t> xq(x.size());
  std::vector<float> xs(size_t(K / 128 * T));
  cpu::fp8_quantize_act_1x128(x.data(), T, K, xq.data(), xs.data(), T);
  std::vector<float> xd(x.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) xd[size_t(t * K + k)] = e4m3_to_f32(xq[size_t(t * K + k)]) * xs[size_t(k / 128 * T + t)];
  return rel_l2(gemm(xd, T, K, Wmx, N), ymx);
}

void print_header() {
  std::printf("| weights | N×K | target | ‖ΔW‖/‖W‖ | max|ΔW|/max|W| | values changed | non-zeros flushed | ‖Δy‖/‖y‖ | max|Δy|/max|y| |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
}
void print_row(const std::string& name, int64_t N, int64_t K, const char* target, const Err& e) {
  std::printf("| %s | %lldx%lld | %s | %.2e | %.2e | %.2f %% | %.3f %% | %.2e | %.2e |\n", name.c_str(), (long long)N,
              (long long)K, target, e.fro, e.max_rel, 100 * e.changed, 100 * e.flushed, e.y_rel, e.y_max_rel);
}

// FP8-activation emulation for the model run: GEMMs whose weight is one of `mats` see their input quantised per
// 1×128 block to e4m3 (scale amax/448, the prefill GEMM's quantisation; a short last block when K % 128 ≠ 0).
struct ActQuant {
  std::vector<const float*> mats;
  std::vector<float> buf;
  bool bf16 = false;  // round to bf16 instead (what the bf16 GEMMs and W8A16 do), for calibration
};
const float* act_quant_hook(const float* x, int64_t T, int64_t K, const float* W, void* ctx) {
  ActQuant& a = *static_cast<ActQuant*>(ctx);
  if (std::find(a.mats.begin(), a.mats.end(), W) == a.mats.end()) return nullptr;
  a.buf.assign(x, x + T * K);
  if (a.bf16) {
    for (float& v : a.buf) v = round_to_bf16(v);
    return a.buf.data();
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k0 = 0; k0 < K; k0 += 128) {
      float* b = a.buf.data() + t * K + k0;
      const int64_t n = std::min<int64_t>(128, K - k0);
      float amax = 0.f;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(b[i]));
      const float s = amax > 0.f ? amax / 448.0f : 1.0f;
      for (int64_t i = 0; i < n; ++i) b[i] = e4m3_to_f32(cpu::e4m3_rne(b[i] / s)) * s;
    }
  return a.buf.data();
}

// Logits of every position of `ids` (one-shot prefill on the CPU model).
std::vector<float> model_logits(const M3Config& c, M3Weights w, const std::vector<int32_t>& ids) {
  M3Model model(c, std::move(w));
  const int64_t T = int64_t(ids.size());
  KVCache cache(c, int32_t((T + c.sparse_block_size - 1) / c.sparse_block_size));
  SequenceKV seq(cache);
  seq.reserve(T);
  SeqInput in{std::span<const int32_t>(ids), 0, seq.pages(), true};
  return model.forward(std::span<const SeqInput>(&in, 1), cache)[0];
}

// Per row r: max|a − b| / max|b| (the golden test's measure, tolerance 1e-4). Returns its maximum and median over
// rows and the share of rows whose argmax agrees.
struct RowErr {
  double max = 0, p50 = 0, argmax_agree = 1;
};
RowErr row_errors(const std::vector<float>& a, const std::vector<float>& b, int64_t cols) {
  const int64_t rows = int64_t(b.size()) / cols;
  std::vector<double> e(static_cast<size_t>(rows));
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double scale = 1e-30, err = 0;
    int64_t ia = 0, ib = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      scale = std::max(scale, double(std::fabs(b[i])));
      err = std::max(err, double(std::fabs(a[i] - b[i])));
      if (a[i] > a[size_t(r * cols + ia)]) ia = c;
      if (b[i] > b[size_t(r * cols + ib)]) ib = c;
    }
    e[size_t(r)] = err / scale;
    agree += ia == ib;
  }
  RowErr out;
  if (rows == 0) return out;
  std::sort(e.begin(), e.end());
  out.max = e.back();
  out.p50 = e[e.size() / 2];
  out.argmax_agree = double(agree) / double(rows);
  return out;
}

void through_the_model(const std::string& dir, const SafeTensors& st) {
  const std::string gold_path = dir + "/golden.safetensors";
  FILE* f = std::fopen(gold_path.c_str(), "rb");
  if (!f) return;
  std::fclose(f);
  const M3Config c = load_m3_config(dir + "/config.json");
  const SafeTensors gold = SafeTensors::open(gold_path);
  const TensorRef& it = gold.get("input_ids");
  std::vector<int32_t> ids(size_t(it.numel()));
  std::memcpy(ids.data(), it.data, it.nbytes);
  const std::vector<float> ref = gold.read_f32("logits", gold.get("logits").shape);
  const M3Weights w0 = M3Weights::load(c, st);
  const std::vector<float> base = model_logits(c, w0, ids);
  const int64_t V = c.vocab_size;
  std::printf("\n## Through the CPU model: %s, %zu positions (golden test tolerance: 1e-4 row-relative)\n\n",
              dir.c_str(), ids.size());
  std::printf("| weights (GEMM inputs) | logits vs HF reference: max / median row | vs exact MXFP8: max / median row | "
              "argmax = exact MXFP8 | matrices converted |\n");
  std::printf("|---|---|---|---|---|\n");
  const RowErr e0 = row_errors(base, ref, V);
  std::printf("| exact MXFP8 (dequantised to fp32) | %.2e / %.2e | 0 | 100 %% | 0 |\n", e0.max, e0.p50);
  // 0, 1: weights requantised; 2: + e4m3 activations into every converted matrix; 3: the same but the index
  // projection keeps bf16 activations; 4: bf16 activations (calibration: what the bf16 path already costs).
  for (int variant = 0; variant < 5; ++variant) {
    const Fp8Scale fmt = variant == 0 ? Fp8Scale::Row128 : Fp8Scale::Blk128;
    const bool quant_act = variant >= 2;
    M3Weights w = w0;
    ActQuant aq;
    aq.bf16 = variant == 4;
    int converted = 0;
    for (const WeightSlot& s : weight_plan(c)) {
      if (!s.matrix || !fp8_tools::slot_pieces_mxfp8(st, s)) continue;
      std::vector<float>& dst = host_slot(w, s);
      dst = fp8_tools::requantised_slot(st, s, fmt);
      if (!(variant == 3 && s.kind == SlotKind::WIndexQk))
        aq.mats.push_back(dst.data());  // stays valid: the model takes the vectors by move
      ++converted;
    }
    if (quant_act) cpu::set_matmul_input_hook(act_quant_hook, &aq);
    const std::vector<float> got = model_logits(c, std::move(w), ids);
    cpu::set_matmul_input_hook(nullptr, nullptr);
    const RowErr er = row_errors(got, ref, V), eb = row_errors(got, base, V);
    std::printf("| requantised to %s%s | %.2e / %.2e | %.2e / %.2e | %.1f %% | %d |\n", fp8_scale_name(fmt),
                !quant_act ? "" : aq.bf16 ? " + bf16 activations (W8A16, bf16 GEMMs)"
                : variant == 3 ? " + e4m3 1×128 activations except the index projection"
                               : " + e4m3 1×128 activations (the prefill GEMM)",
                er.max, er.p50, eb.max, eb.p50, 100 * eb.argmax_agree, converted);
  }
}

struct Dist {
  const char* name;
  int kind;
};
constexpr Dist kDists[] = {
    {"gaussian σ=0.02", 0},
    {"gaussian, column scales lognormal(σ=1)", 1},
    {"student-t ν=3", 2},
    {"gaussian + 1 % columns ×30", 3},
    {"gaussian, row scales lognormal(σ=1)", 4},
};

std::vector<float> synth(int kind, int64_t N, int64_t K, std::mt19937_64& g) {
  std::normal_distribution<float> d(0.f, 0.02f), ln(0.f, 1.f);
  std::student_t_distribution<float> t3(3.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> col(size_t(K), 1.f), row(size_t(N), 1.f);
  if (kind == 1) for (auto& c : col) c = std::exp(ln(g));
  if (kind == 3) for (auto& c : col) c = u(g) < 0.01f ? 30.f : 1.f;
  if (kind == 4) for (auto& r : row) r = std::exp(ln(g));
  std::vector<float> w(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      w[size_t(n * K + k)] = (kind == 2 ? 0.01f * t3(g) : d(g)) * col[size_t(k)] * row[size_t(n)];
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ckpt;
  int64_t N = 512, K = 6144, T = 16;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--checkpoint") && i + 1 < argc) ckpt = argv[++i];
    else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) N = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else return std::fprintf(stderr, "usage: fp8_accuracy [--checkpoint DIR] [--rows N] [--seed S]\n"), 2;
  }
  try {
    std::mt19937_64 g(seed);
    std::printf("## Synthetic weights (MX-quantised from fp32 by cpu::mx_quantize), x: %lld bf16 rows, N(0,1) with 0.5 %% "
                "of channels ×20\n\n", (long long)T);
    print_header();
    std::vector<std::string> context;
    for (const Dist& dist : kDists) {
      const auto w = synth(dist.kind, N, K, g);
      std::vector<uint8_t> q(w.size()), s(size_t(N * K / 32));
      cpu::mx_quantize(w.data(), N, K, q.data(), s.data());
      std::vector<float> Wmx(w.size());
      cpu::fp8_dequant(q.data(), s.data(), Fp8Scale::G32, N, K, Wmx.data());
      const auto x = activations(T, K, g);
      const auto ymx = gemm(x, T, K, Wmx, N), yf = gemm(x, T, K, w, N);
      for (Fp8Scale f : {Fp8Scale::Row128, Fp8Scale::Blk128})
        print_row(dist.name, N, K, fp8_scale_name(f), requant_error(q, s, N, K, f, Wmx, x, T, ymx));
      char line[512];
      std::snprintf(line, sizeof line, "| %s | %.2e | %.2e | %.2e |\n", dist.name, rel_l2(Wmx, w), rel_l2(ymx, yf),
                    act_quant_error(x, T, K, Wmx, N, ymx));
      context.push_back(line);
    }
    std::printf("\n### Context: MXFP8 itself vs the fp32 weights, and the 1×128 e4m3 activation quantisation\n\n");
    std::printf("| weights | MXFP8 ‖ΔW‖/‖W‖ | MXFP8 ‖Δy‖/‖y‖ | e4m3 1×128 activations ‖Δy‖/‖y‖ |\n|---|---|---|---|\n");
    for (const auto& l : context) std::printf("%s", l.c_str());

    if (!ckpt.empty()) {
      const SafeTensors st = SafeTensors::open(ckpt);
      std::printf("\n## Checkpoint %s: every F8_E4M3 tensor with a UE8M0 scale\n\n", ckpt.c_str());
      print_header();
      Err worst[2];
      int count = 0;
      for (const std::string& name : st.names()) {
        const TensorRef& t = st.get(name);
        if (t.dtype != DType::F8_E4M3 || t.shape.size() != 2) continue;
        const std::string sname = name.substr(0, name.size() - std::string(".weight").size()) + ".weight_scale_inv";
        if (!st.has(sname)) continue;
        const int64_t n = t.shape[0], k = t.shape[1];
        const TensorRef& sc = st.get(sname);
        std::vector<uint8_t> q(t.data, t.data + n * k), s(sc.data, sc.data + sc.nbytes);
        if (int64_t(s.size()) != n * ((k + 31) / 32)) continue;
        std::vector<float> Wmx(size_t(n * k));
        cpu::fp8_dequant(q.data(), s.data(), Fp8Scale::G32, n, k, Wmx.data());
        std::mt19937_64 gx(seed + count);
        const auto x = activations(T, k, gx);
        const auto ymx = gemm(x, T, k, Wmx, n);
        int fi = 0;
        for (Fp8Scale f : {Fp8Scale::Row128, Fp8Scale::Blk128}) {
          Err e = requant_error(q, s, n, k, f, Wmx, x, T, ymx);
          print_row(name, n, k, fp8_scale_name(f), e);
          Err& w = worst[fi++];
          w.fro = std::max(w.fro, e.fro), w.max_rel = std::max(w.max_rel, e.max_rel);
          w.changed = std::max(w.changed, e.changed), w.flushed = std::max(w.flushed, e.flushed);
          w.y_rel = std::max(w.y_rel, e.y_rel), w.y_max_rel = std::max(w.y_max_rel, e.y_max_rel);
        }
        ++count;
      }
      std::printf("\n%d tensors; worst per column:\n\n", count);
      print_header();
      print_row("worst of the checkpoint", 0, 0, fp8_scale_name(Fp8Scale::Row128), worst[0]);
      print_row("worst of the checkpoint", 0, 0, fp8_scale_name(Fp8Scale::Blk128), worst[1]);
      through_the_model(ckpt, st);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_accuracy: %s\n", e.what());
    return 1;
  }
  return 0;
}
