// GEMM: the ONLY place a BLAS (oneDNN or CBLAS on the host, cuBLAS on CUDA) is called.
// Row-major convention throughout: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// lda/ldb/ldc are row strides of the stored (untransposed) matrices. Pointers are device
// pointers of the default memory space (host memory on host builds).
#pragma once
#include <cstdint>

namespace trident {

enum class Trans { N, T };

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// `batch` independent GEMMs; matrix b of A starts at A + b * strideA (likewise B, C).
void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B,
                          std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                          std::int64_t strideC, std::int64_t batch);

// Name of the library behind gemm(), for logs.
const char* gemm_backend_name();

}  // namespace trident
