// GEMMs over operands of a run-time type (GemmOperand, ops/gemm.hpp), built on every backend:
// gemm_mixed sends two operands of one type to gemm (fp32), gemm_bf16 or gemm_fp16, always with
// an fp32 C, and refuses mixed types; the strided-batched variant uses the batched GEMM of fp32
// and bf16 and loops over the batch for fp16 (docs/DESIGN.md "Mixed precision").
#include <sstream>

#include "common/error.hpp"
#include "common/types.hpp"
#include "ops/gemm.hpp"

namespace trident {

void gemm_mixed(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, GemmOperand A,
                std::int64_t lda, GemmOperand B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (A.dt != B.dt) {
    std::ostringstream os;
    os << "internal: gemm_mixed with operands of different types (" << dtype_name(A.dt) << ", " << dtype_name(B.dt)
       << ")";
    throw Error::one(os.str());
  }
  switch (A.dt) {
    case DType::F32:
      gemm(ta, tb, M, N, K, alpha, static_cast<const float*>(A.p), lda, static_cast<const float*>(B.p), ldb, beta, C,
           ldc);
      break;
    case DType::BF16:
      gemm_bf16(ta, tb, M, N, K, alpha, static_cast<const std::uint16_t*>(A.p), lda,
                static_cast<const std::uint16_t*>(B.p), ldb, beta, C, ldc);
      break;
    case DType::F16:
      gemm_fp16(ta, tb, M, N, K, alpha, static_cast<const std::uint16_t*>(A.p), lda,
                static_cast<const std::uint16_t*>(B.p), ldb, beta, C, ldc);
      break;
  }
}

void gemm_mixed_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                                GemmOperand A, std::int64_t lda, std::int64_t strideA, GemmOperand B, std::int64_t ldb,
                                std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                                std::int64_t batch) {
  if (A.dt == DType::F32 && B.dt == DType::F32) {
    gemm_strided_batched(ta, tb, M, N, K, alpha, static_cast<const float*>(A.p), lda, strideA,
                         static_cast<const float*>(B.p), ldb, strideB, beta, C, ldc, strideC, batch);
    return;
  }
  if (A.dt == DType::BF16 && B.dt == DType::BF16) {
    gemm_bf16_strided_batched(ta, tb, M, N, K, alpha, static_cast<const std::uint16_t*>(A.p), lda, strideA,
                              static_cast<const std::uint16_t*>(B.p), ldb, strideB, beta, C, ldc, strideC, batch);
    return;
  }
  for (std::int64_t b = 0; b < batch; ++b)
    gemm_mixed(ta, tb, M, N, K, alpha, A.at(b * strideA), lda, B.at(b * strideB), ldb, beta, C + b * strideC, ldc);
}

void gemm_grouped_scale(float beta, const GemmGroup& g) {
  if (beta == 1.f || g.M <= 0 || g.N <= 0) return;
  float* c = g.C;
  const std::int64_t N = g.N, ldc = g.ldc;
  Kokkos::parallel_for(
      "ops::gemm_grouped_scale", range(g.M * N), KOKKOS_LAMBDA(std::int64_t i) {
        c[(i / N) * ldc + i % N] = beta == 0.f ? 0.f : beta * c[(i / N) * ldc + i % N];
      });
}

}  // namespace trident
