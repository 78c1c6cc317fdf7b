// cuBLASLt GEMM wrapper. Row-major y[T,N] = x[T,K]·W[N,K]ᵀ is column-major yᵀ[N,T] = op(W)·xᵀ with
// W seen as a column-major K×N matrix (ld K) transposed ("TN"), xᵀ a column-major K×T matrix (ld K), yᵀ ld N.
#include "backend/cuda/gemm.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>

namespace m3::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

#define M3_LT_CHECK(expr)                                                                 \
  do {                                                                                   \
    cublasStatus_t st_ = (expr);                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS) failf("cuBLASLt error %d in %s at %s:%d", int(st_), #expr, __FILE__, __LINE__); \
  } while (0)

__global__ void f32_to_bf16_kernel(const float* __restrict__ src, int64_t n, __nv_bfloat16* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

// Largest power of two ≤ 256 dividing the address (cuBLASLt assumes 256-byte alignment unless told otherwise).
int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al)) al >>= 1;
  return al;
}

}  // namespace

void f32_to_bf16(const float* src, int64_t n, uint16_t* dst, cudaStream_t s) {
  if (n <= 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  f32_to_bf16_kernel<<<unsigned(blocks), threads, 0, s>>>(src, n, reinterpret_cast<__nv_bfloat16*>(dst));
  M3_CUDA_LAUNCH_CHECK();
}

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Gemm::Gemm() {
  cublasLtHandle_t h = nullptr;
  M3_LT_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_.grow(kWorkspaceBytes);
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Gemm::Plan& Gemm::plan_for(int64_t T, int64_t K, int64_t N, WType wt, bool accumulate, int align) {
  const Key key{T, K, N, int(wt), int(accumulate), align};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const cudaDataType_t ab = wt == WType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  // CUBLAS_COMPUTE_32F: true fp32 accumulation (no TF32 shortcut) for both input types.
  M3_LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  M3_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  M3_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, uint64_t(K), uint64_t(N), K));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, uint64_t(K), uint64_t(T), K));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, uint64_t(N), uint64_t(T), N));
  cublasLtMatmulPreference_t pref = nullptr;
  M3_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.size();
  const uint32_t al = uint32_t(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a,
                                                           p->b, p->c, p->c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    failf("cuBLASLt has no algorithm for T=%lld K=%lld N=%lld (%s weights, alignment %d): status %d", (long long)T,
          (long long)K, (long long)N, wt == WType::BF16 ? "bf16" : "f32", align, int(st));
  p->algo = res.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void Gemm::nt(const float* x, int64_t T, int64_t K, const void* W, WType wt, int64_t N, float* y, bool accumulate,
              cudaStream_t s) {
  if (T <= 0 || N <= 0) return;
  M3_CUDA_REQUIRE(K > 0, "gemm: K must be positive, got %lld", (long long)K);
  const void* xin = x;
  if (wt == WType::BF16) {
    xb_.grow(size_t(T * K));
    f32_to_bf16(x, T * K, xb_.get(), s);
    xin = xb_.get();
  }
  matmul(xin, T, K, W, wt, N, y, accumulate, s);
}

void Gemm::nt_bf16(const uint16_t* xb, int64_t T, int64_t K, const void* W, int64_t N, float* y, bool accumulate,
                   cudaStream_t s) {
  if (T <= 0 || N <= 0) return;
  M3_CUDA_REQUIRE(K > 0, "gemm: K must be positive, got %lld", (long long)K);
  matmul(xb, T, K, W, WType::BF16, N, y, accumulate, s);
}

void Gemm::matmul(const void* xin, int64_t T, int64_t K, const void* W, WType wt, int64_t N, float* y,
                  bool accumulate, cudaStream_t s) {
  int align = std::min(std::min(alignment_of(xin), alignment_of(W)), alignment_of(y));
  // Leading dimensions also bound the alignment of every column start.
  const int esz = wt == WType::BF16 ? 2 : 4;
  while (align > 1 && ((K * esz) % align || (N * 4) % align)) align >>= 1;
  Plan& p = plan_for(T, K, N, wt, accumulate, align);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  M3_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, W, p.a, xin, p.b, &beta, y, p.c,
                             y, p.c, &p.algo, workspace_.get(), workspace_.size(), s));
}

}  // namespace m3::cuda
