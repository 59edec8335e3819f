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
#include <unordered_map>
#include <algorithm>
#include <string>
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
// created on first use. A transpose is a stride swap of the memory descriptor. `concurrent`
// primitives (for the batched GEMM) take their scratchpad from the caller, which oneDNN requires
// of a primitive executed by several threads at once (scratchpad_mode::user).
using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       float, float, bool>;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct Bf16Gemm {
  Trans ta, tb;
  std::int64_t M, N, K;
  float alpha;
  std::int64_t lda, ldb;
  float beta;
  std::int64_t ldc;

  dnnl::memory::desc a() const { return desc(M, K, ta == Trans::T, lda, dnnl::memory::data_type::bf16); }
  dnnl::memory::desc b() const { return desc(K, N, tb == Trans::T, ldb, dnnl::memory::data_type::bf16); }
  dnnl::memory::desc c() const { return desc(M, N, false, ldc, dnnl::memory::data_type::f32); }
  // rows x cols stored row-major with row stride ld, or its transpose
  static dnnl::memory::desc desc(std::int64_t rows, std::int64_t cols, bool trans, std::int64_t ld,
                                 dnnl::memory::data_type type) {
    using dims = dnnl::memory::dims;
    return {dims{rows, cols}, type, trans ? dims{1, ld} : dims{ld, 1}};
  }
};

struct Bf16Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc scratchpad;  // concurrent primitives only
};

const Bf16Matmul& bf16_matmul(const Bf16Gemm& g, bool concurrent) {
  static std::map<Key, Bf16Matmul> cache;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{g.ta == Trans::T, g.tb == Trans::T, g.M, g.N, g.K, g.lda, g.ldb, g.ldc, g.alpha, g.beta, concurrent};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  dnnl::primitive_attr attr;
  if (g.alpha != 1.f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(g.beta);
    attr.set_post_ops(po);
  }
  if (concurrent) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g.a(), g.b(), g.c()), attr, cpu_engine());
  return cache.emplace(key, Bf16Matmul{dnnl::matmul(pd), concurrent ? pd.scratchpad_desc() : dnnl::memory::desc()})
      .first->second;
}

// C = alpha op(A) op(B) + beta C through `mm`; with a concurrent primitive, `scratch` is this
// thread's scratchpad buffer. dnnl::error is left to the caller.
void execute_bf16(const Bf16Gemm& g, const Bf16Matmul& mm, const std::uint16_t* A, const std::uint16_t* B, float* C,
                  std::vector<char>* scratch) {
  dnnl::engine& eng = cpu_engine();
  const dnnl::memory a(g.a(), eng, const_cast<std::uint16_t*>(A));
  const dnnl::memory b(g.b(), eng, const_cast<std::uint16_t*>(B));
  const dnnl::memory c(g.c(), eng, C);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (scratch) {
    scratch->resize(std::max<size_t>(mm.scratchpad.get_size(), 1));
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(mm.scratchpad, eng, scratch->data()));
  }
  dnnl::stream st(eng);
  mm.prim.execute(st, args);
  st.wait();
}

[[noreturn]] void bf16_failed(const char* what, const Bf16Gemm& g, std::int64_t batch) {
  std::ostringstream os;
  os << "oneDNN bf16 matmul failed (" << what << ") M=" << g.M << " N=" << g.N << " K=" << g.K;
  if (batch != 1) os << " batch=" << batch;
  throw Error::one(os.str());
}
}  // namespace
#endif

void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  Kokkos::Profiling::pushRegion("ops::gemm_bf16");
#if defined(TRIDENT_GEMM_DNNL)
  const Bf16Gemm g{ta, tb, M, N, K, alpha, lda, ldb, beta, ldc};
  try {
    execute_bf16(g, bf16_matmul(g, false), A, B, C, nullptr);
  } catch (const dnnl::error& e) {
    bf16_failed(e.what(), g, 1);
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

void gemm_bf16_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const std::uint16_t* A, std::int64_t lda, std::int64_t strideA, const std::uint16_t* B,
                               std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                               std::int64_t strideC, std::int64_t batch) {
  check_dims(M, N, K);
#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
  // As gemm_strided_batched: the batch shared by the rank's threads, each product whole on one
  // thread (oneDNN runs sequentially inside a parallel region), so each has the bits gemm_bf16
  // gives it on one thread, whatever the thread count. One profiling region.
  if (batch > 1 && M > 0 && N > 0 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
    Kokkos::Profiling::pushRegion("ops::gemm_bf16");
    const Bf16Gemm g{ta, tb, M, N, K, alpha, lda, ldb, beta, ldc};
    std::string first_error;
    try {
      const Bf16Matmul& mm = bf16_matmul(g, true);
#pragma omp parallel
      {
        std::vector<char> scratch;
#pragma omp for schedule(static)
        for (std::int64_t b = 0; b < batch; ++b) {
          try {
            execute_bf16(g, mm, A + b * strideA, B + b * strideB, C + b * strideC, &scratch);
          } catch (const std::exception& e) {
#pragma omp critical(trident_gemm_error)
            if (first_error.empty()) first_error = e.what();
          }
        }
      }
    } catch (const dnnl::error& e) {
      first_error = e.what();
    }
    Kokkos::Profiling::popRegion();
    if (!first_error.empty()) bf16_failed(first_error.c_str(), g, batch);
    return;
  }
#endif
  for (std::int64_t b = 0; b < batch; ++b)
    gemm_bf16(ta, tb, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb, beta, C + b * strideC, ldc);
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
