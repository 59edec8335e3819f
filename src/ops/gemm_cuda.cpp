// Device GEMM through cuBLAS (CUDA builds only; src/CMakeLists.txt drops *_cuda.cpp otherwise).
// Row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T by swapping
// the operands, so no transposes are materialised. One handle per process, bound to the
// Kokkos CUDA stream.
#include <cublas_v2.h>

#include <Kokkos_Core.hpp>
#include <sstream>

#include "common/error.hpp"
#include "ops/gemm.hpp"

#define TRIDENT_CUBLAS(call)                                                                                \
  do {                                                                                                      \
    cublasStatus_t trident_st_ = (call);                                                                    \
    if (trident_st_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::ostringstream trident_os_;                                                                       \
      trident_os_ << "cuBLAS call " #call " failed with status " << static_cast<int>(trident_st_) << " at " \
                  << __FILE__ << ":" << __LINE__;                                                           \
      throw ::trident::Error::one(trident_os_.str());                                                       \
    }                                                                                                       \
  } while (0)

namespace trident {

namespace {
cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t created;
    TRIDENT_CUBLAS(cublasCreate(&created));
    TRIDENT_CUBLAS(cublasSetStream(created, Kokkos::Cuda().cuda_stream()));
    return created;
  }();
  return h;
}
cublasOperation_t op(Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; }
// A Kokkos Tools region around each cuBLAS call, named as the host GEMMs' regions are, so that
// perf's kernel timer sees the GEMMs (their time under CUDA_LAUNCH_BLOCKING=1); nothing without a tool.
struct GemmRegion {
  explicit GemmRegion(const char* name) { Kokkos::Profiling::pushRegion(name); }
  ~GemmRegion() { Kokkos::Profiling::popRegion(); }
  GemmRegion(const GemmRegion&) = delete;
  GemmRegion& operator=(const GemmRegion&) = delete;
};
}  // namespace

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  const GemmRegion region("ops::gemm");
  TRIDENT_CUBLAS(cublasSgemm(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                             &alpha, B, static_cast<int>(ldb), A, static_cast<int>(lda), &beta, C,
                             static_cast<int>(ldc)));
}

void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B, std::int64_t ldb,
                          std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                          std::int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const GemmRegion region("ops::gemm_batched");
  TRIDENT_CUBLAS(cublasSgemmStridedBatched(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M),
                                           static_cast<int>(K), &alpha, B, static_cast<int>(ldb), strideB, A,
                                           static_cast<int>(lda), strideA, &beta, C, static_cast<int>(ldc), strideC,
                                           static_cast<int>(batch)));
}

namespace {
// 16-bit words (CUDA_R_16BF or CUDA_R_16F bit for bit) with products accumulated in fp32
void gemm_16bit(cudaDataType type, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta,
                float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  const GemmRegion region(type == CUDA_R_16BF ? "ops::gemm_bf16" : "ops::gemm_fp16");
  TRIDENT_CUBLAS(cublasGemmEx(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                              &alpha, B, type, static_cast<int>(ldb), A, type, static_cast<int>(lda), &beta, C,
                              CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
// `batch` such products at strides, in one cuBLAS call
void gemm_16bit_strided_batched(cudaDataType type, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                                float alpha, const std::uint16_t* A, std::int64_t lda, std::int64_t strideA,
                                const std::uint16_t* B, std::int64_t ldb, std::int64_t strideB, float beta, float* C,
                                std::int64_t ldc, std::int64_t strideC, std::int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const GemmRegion region(type == CUDA_R_16BF ? "ops::gemm_bf16_batched" : "ops::gemm_fp16_batched");
  TRIDENT_CUBLAS(cublasGemmStridedBatchedEx(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M),
                                            static_cast<int>(K), &alpha, B, type, static_cast<int>(ldb), strideB, A,
                                            type, static_cast<int>(lda), strideA, &beta, C, CUDA_R_32F,
                                            static_cast<int>(ldc), strideC, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  gemm_16bit(CUDA_R_16BF, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const std::uint16_t* A, std::int64_t lda, std::int64_t strideA, const std::uint16_t* B,
                               std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                               std::int64_t strideC, std::int64_t batch) {
  // one call for the batch: a call per product cost about 5 us of launch each, 18 thousand calls per
  // step for GPT-2 124M's unfused attention at micro-batch 16 (perf/results/gpu_check_2026-12-04.md)
  gemm_16bit_strided_batched(CUDA_R_16BF, ta, tb, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,
                             strideC, batch);
}

void gemm_fp16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  gemm_16bit(CUDA_R_16F, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_set_tf32(bool on) {
  TRIDENT_CUBLAS(cublasSetMathMode(handle(), on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

const char* gemm_backend_name() { return "cuBLAS"; }

}  // namespace trident
