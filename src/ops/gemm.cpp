// Host GEMM through oneDNN (dnnl_sgemm, row-major, picks AVX-512/AMX kernels at run time) or a
// CBLAS (OpenBLAS) fallback. The CUDA build uses gemm_cuda.cpp instead.
#include "ops/gemm.hpp"

#include <Kokkos_Core.hpp>
#include <sstream>

#include "common/error.hpp"
#include "common/half.hpp"

#if !defined(TRIDENT_ENABLE_CUDA)
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#if defined(TRIDENT_GEMM_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#if defined(_OPENMP)
#include <omp.h>
#endif
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
#if defined(TRIDENT_GEMM_DNNL)
char dnnl_trans(Trans t) { return t == Trans::T ? 'T' : 'N'; }
[[noreturn]] void dnnl_failed(dnnl_status_t st, std::int64_t M, std::int64_t N, std::int64_t K, const char* what) {
  std::ostringstream os;
  os << "dnnl_sgemm failed (status " << static_cast<int>(st) << ") M=" << M << " N=" << N << " K=" << K << what;
  throw Error::one(os.str());
}
#endif
}  // namespace

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  // A profiling region, so that Kokkos Tools (perf/kernel_timer) see GEMMs next to kernels.
  Kokkos::Profiling::pushRegion("ops::gemm");
#if defined(TRIDENT_GEMM_DNNL)
  const dnnl_status_t st = dnnl_sgemm(dnnl_trans(ta), dnnl_trans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success) dnnl_failed(st, M, N, K, "");
  Kokkos::Profiling::popRegion();
#else
  cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans, tb == Trans::T ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
  Kokkos::Profiling::popRegion();
#endif
}

void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B, std::int64_t ldb,
                          std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                          std::int64_t batch) {
#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
  // The batch (attention's per-head products, 64 x 64 x 64 at GPT-2's shapes) shared by this
  // rank's threads, each product whole on one thread (oneDNN runs sequentially inside a parallel
  // region), rather than every small product split over all threads in turn: the same kernels
  // as one thread, so the same bits (validation/identity.py --threads). One profiling region.
  check_dims(M, N, K);
  if (batch > 1 && M > 0 && N > 0 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
    Kokkos::Profiling::pushRegion("ops::gemm");
    dnnl_status_t first_error = dnnl_success;
#pragma omp parallel for schedule(static)
    for (std::int64_t b = 0; b < batch; ++b) {
      const dnnl_status_t st = dnnl_sgemm(dnnl_trans(ta), dnnl_trans(tb), M, N, K, alpha, A + b * strideA, lda,
                                          B + b * strideB, ldb, beta, C + b * strideC, ldc);
      if (st != dnnl_success) {
#pragma omp critical(trident_gemm_error)
        first_error = first_error == dnnl_success ? st : first_error;
      }
    }
    Kokkos::Profiling::popRegion();
    if (first_error != dnnl_success) dnnl_failed(first_error, M, N, K, " (batched)");
    return;
  }
#endif
  for (std::int64_t b = 0; b < batch; ++b)
    gemm(ta, tb, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb, beta, C + b * strideC, ldc);
}

#if defined(TRIDENT_GEMM_DNNL)
namespace {
// One oneDNN matmul primitive per distinct GEMM (shape, transposes, strides, alpha, beta),
// created on first use. A transpose is a stride swap of the memory descriptor.
struct Bf16Matmul {
  dnnl::matmul prim;
};
using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       float, float>;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

const Bf16Matmul& bf16_matmul(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                              std::int64_t lda, std::int64_t ldb, float beta, std::int64_t ldc) {
  static std::map<Key, Bf16Matmul> cache;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{ta == Trans::T, tb == Trans::T, M, N, K, lda, ldb, ldc, alpha, beta};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a(dims{M, K}, dt::bf16, ta == Trans::T ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc b(dims{K, N}, dt::bf16, tb == Trans::T ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc c(dims{M, N}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  if (beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return cache.emplace(key, Bf16Matmul{dnnl::matmul(pd)}).first->second;
}
}  // namespace
#endif

void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  Kokkos::Profiling::pushRegion("ops::gemm_bf16");
#if defined(TRIDENT_GEMM_DNNL)
  try {
    const Bf16Matmul& mm = bf16_matmul(ta, tb, M, N, K, alpha, lda, ldb, beta, ldc);
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    dnnl::engine& eng = cpu_engine();
    const dnnl::memory a({dims{M, K}, dt::bf16, ta == Trans::T ? dims{1, lda} : dims{lda, 1}}, eng,
                         const_cast<std::uint16_t*>(A));
    const dnnl::memory b({dims{K, N}, dt::bf16, tb == Trans::T ? dims{1, ldb} : dims{ldb, 1}}, eng,
                         const_cast<std::uint16_t*>(B));
    const dnnl::memory c({dims{M, N}, dt::f32, dims{ldc, 1}}, eng, C);
    dnnl::stream st(eng);
    mm.prim.execute(st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    st.wait();
  } catch (const dnnl::error& e) {
    std::ostringstream os;
    os << "oneDNN bf16 matmul failed (" << e.what() << ") M=" << M << " N=" << N << " K=" << K;
    throw Error::one(os.str());
  }
#else
  // Widen to fp32 (exact) and use sgemm: the same products and fp32 accumulation.
  const std::int64_t ar = ta == Trans::T ? K : M, br = tb == Trans::T ? N : K;
  std::vector<float> a(static_cast<size_t>(ar * lda)), b(static_cast<size_t>(br * ldb));
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_float(A[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_to_float(B[i]);
  cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans, tb == Trans::T ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, a.data(), static_cast<int>(lda),
              b.data(), static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
#endif
  Kokkos::Profiling::popRegion();
}

void gemm_fp16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  // fp16 values widen exactly to fp32: sgemm on the widened operands computes the same
  // products with fp32 accumulation. Buffers are reused between calls.
  static thread_local std::vector<float> a, b;
  const std::int64_t ar = ta == Trans::T ? K : M, br = tb == Trans::T ? N : K;
  a.resize(static_cast<size_t>(ar * lda));
  b.resize(static_cast<size_t>(br * ldb));
  for (size_t i = 0; i < a.size(); ++i) a[i] = fp16_to_float(A[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = fp16_to_float(B[i]);
  gemm(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

void gemm_set_tf32(bool) {}

const char* gemm_backend_name() {
#if defined(TRIDENT_GEMM_DNNL)
  return "oneDNN sgemm";
#else
  return "CBLAS sgemm";
#endif
}

}  // namespace trident
#endif
