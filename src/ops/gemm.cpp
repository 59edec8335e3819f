// Host GEMM through oneDNN (dnnl_sgemm, row-major, picks AVX-512/AMX kernels at run time) or a
// CBLAS (OpenBLAS) fallback. The CUDA build uses gemm_cuda.cpp instead.
#include "ops/gemm.hpp"

#include <Kokkos_Core.hpp>
#include <sstream>

#include "common/error.hpp"

#if !defined(TRIDENT_ENABLE_CUDA)
#if defined(TRIDENT_GEMM_DNNL)
#include <oneapi/dnnl/dnnl.h>
#else
#include <cblas.h>
#endif

namespace trident {

namespace {
void check_dims(std::int64_t M, std::int64_t N, std::int64_t K) {
  if (M < 0 || N < 0 || K < 0) {
    std::ostringstream os;
    os << "gemm: negative dimension M=" << M << " N=" << N << " K=" << K;
    throw Error::one(os.str());
  }
}
}  // namespace

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  // A profiling region, so that Kokkos Tools (perf/kernel_timer) see GEMMs next to kernels.
  Kokkos::Profiling::pushRegion("ops::gemm");
#if defined(TRIDENT_GEMM_DNNL)
  dnnl_status_t st = dnnl_sgemm(ta == Trans::T ? 'T' : 'N', tb == Trans::T ? 'T' : 'N', M, N, K, alpha, A, lda,
                                B, ldb, beta, C, ldc);
  if (st != dnnl_success) {
    std::ostringstream os;
    os << "dnnl_sgemm failed (status " << static_cast<int>(st) << ") M=" << M << " N=" << N << " K=" << K;
    throw Error::one(os.str());
  }
  Kokkos::Profiling::popRegion();
#else
  cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans, tb == Trans::T ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
  Kokkos::Profiling::popRegion();
#endif
}

void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B,
                          std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                          std::int64_t strideC, std::int64_t batch) {
  for (std::int64_t b = 0; b < batch; ++b)
    gemm(ta, tb, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb, beta, C + b * strideC, ldc);
}

const char* gemm_backend_name() {
#if defined(TRIDENT_GEMM_DNNL)
  return "oneDNN sgemm";
#else
  return "CBLAS sgemm";
#endif
}

}  // namespace trident
#endif
