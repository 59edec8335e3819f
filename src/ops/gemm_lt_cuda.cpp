// gemm_lt on CUDA (gemm_lt.hpp): one cublasLtMatmul per call, on the Kokkos CUDA stream, from the
// call's plan (lt_plan: the row-major call as cuBLASLt's column-major one). Per call shape (the
// plan's dimensions, transposes, types, epilogue and the operands' 16-byte alignment) the
// descriptors and the heuristic's first algorithm are made once and kept; each call sets only the
// pointers. A 32 MiB workspace, allocated at the first call. Where the heuristic offers no
// algorithm for a shape, that shape runs as gemm_mixed into an fp32 buffer and one epilogue kernel,
// and the first such call says so on stderr.
#include <cublasLt.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "common/device_math.hpp"
#include "common/error.hpp"
#include "ops/gelu.hpp"
#include "ops/gemm_cublas_status.hpp"
#include "ops/gemm_lt.hpp"
#include "ops/gemm_region.hpp"

#define TRIDENT_CUBLASLT(call) TRIDENT_CUBLAS_STATUS("cuBLASLt", call)

namespace trident {

namespace {
constexpr std::size_t kWorkspaceBytes = 32u << 20;

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t created;
    TRIDENT_CUBLASLT(cublasLtCreate(&created));
    return created;
  }();
  return h;
}

void* workspace() {
  static Kokkos::View<char*, Kokkos::CudaSpace> w("ops::gemm_lt_workspace", kWorkspaceBytes);
  return w.data();
}

cudaDataType cuda_type(DType dt) {
  return dt == DType::F32 ? CUDA_R_32F : dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

std::int64_t aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) % 16) == 0 ? 1 : 0; }

// The descriptors and algorithm of one call shape
struct Shape {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

template <class T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  TRIDENT_CUBLASLT(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

Shape& shape_of(const LtPlan& p, const GemmLt& g) {
  static std::map<std::vector<std::int64_t>, Shape> kept;
  const std::vector<std::int64_t> key{p.m,
                                      p.n,
                                      p.k,
                                      p.trans_a,
                                      p.trans_b,
                                      p.lda,
                                      p.ldb,
                                      p.ldd,
                                      static_cast<std::int64_t>(p.ab_dt),
                                      static_cast<std::int64_t>(p.d_dt),
                                      static_cast<std::int64_t>(p.epilogue),
                                      static_cast<std::int64_t>(g.bias_dt),
                                      p.aux_ld,
                                      aligned16(p.a),
                                      aligned16(p.b),
                                      aligned16(g.C),
                                      aligned16(g.bias),
                                      aligned16(g.aux)};
  auto it = kept.find(key);
  if (it != kept.end()) return it->second;
  Shape s;
  TRIDENT_CUBLASLT(cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(p.epilogue));
  if (p.epilogue != Epilogue::None) {
    set(s.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(cuda_type(g.bias_dt)));
    set(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  }
  if (p.epilogue == Epilogue::GeluAuxBias) {
    set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
  }
  TRIDENT_CUBLASLT(cublasLtMatrixLayoutCreate(&s.a, cuda_type(p.ab_dt), static_cast<std::uint64_t>(p.a_rows),
                                              static_cast<std::uint64_t>(p.a_cols), p.lda));
  TRIDENT_CUBLASLT(cublasLtMatrixLayoutCreate(&s.b, cuda_type(p.ab_dt), static_cast<std::uint64_t>(p.b_rows),
                                              static_cast<std::uint64_t>(p.b_cols), p.ldb));
  TRIDENT_CUBLASLT(cublasLtMatrixLayoutCreate(&s.d, cuda_type(p.d_dt), static_cast<std::uint64_t>(p.m),
                                              static_cast<std::uint64_t>(p.n), p.ldd));
  cublasLtMatmulPreference_t pref;
  TRIDENT_CUBLASLT(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = kWorkspaceBytes;
  TRIDENT_CUBLASLT(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), s.desc, s.a, s.b, s.d, s.d, pref, 1, &result,
                                                           &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  s.found = st == CUBLAS_STATUS_SUCCESS && returned > 0;
  if (s.found) {
    s.algo = result.algo;
  } else {
    std::fprintf(stderr,
                 "gemm_lt: cuBLASLt offers no algorithm for m=%lld n=%lld k=%lld, epilogue %s, %s output (status %d): "
                 "this shape runs as a GEMM and an epilogue kernel\n",
                 static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k),
                 epilogue_name(p.epilogue), dtype_name(p.d_dt), static_cast<int>(st));
  }
  return kept.emplace(key, s).first->second;
}

// Where cuBLASLt has no algorithm: the products in fp32, then the epilogue as one kernel
template <class F, class Out>
void fallback(const GemmLt& g) {
  static Kokkos::View<float*, Kokkos::CudaSpace> z;
  if (z.extent(0) < static_cast<std::size_t>(g.M * g.N))
    z = Kokkos::View<float*, Kokkos::CudaSpace>("ops::gemm_lt_products", g.M * g.N);
  float* zp = z.data();
  gemm_mixed(g.ta, g.tb, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb, 0.f, zp, g.N);
  Out* c = static_cast<Out*>(g.C);
  Out* aux = static_cast<Out*>(g.aux);
  const float* bias32 = g.bias_dt == DType::F32 ? static_cast<const float*>(g.bias) : nullptr;
  const Out* bias16 = g.bias_dt == DType::F32 ? nullptr : static_cast<const Out*>(g.bias);
  const std::int64_t N = g.N, ldc = g.ldc, ldaux = g.ldaux;
  const int ep = static_cast<int>(g.epilogue);
  Kokkos::parallel_for(
      "ops::gemm_lt_epilogue", Kokkos::RangePolicy<Kokkos::Cuda>(0, g.M * g.N), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / N, j = i - r * N;
        const float b = ep == 0 ? 0.f : bias32 ? bias32[j] : F::load(bias16[j]);
        const float t = zp[i] + b;
        if (ep == 2) {
          aux[r * ldaux + j] = F::store(t);
          c[r * ldc + j] = F::store(gelu_tanh(t));
        } else {
          c[r * ldc + j] = F::store(t);
        }
      });
}
}  // namespace

void gemm_lt(const GemmLt& g) {
  const LtPlan p = lt_plan(g);
  if (!p.error.empty()) throw Error::one("gemm_lt: " + p.error);
  if (g.M == 0 || g.N == 0) return;
  const GemmRegion region(g.A.dt == DType::F32    ? "ops::gemm_lt"
                          : g.A.dt == DType::BF16 ? "ops::gemm_lt_bf16"
                                                  : "ops::gemm_lt_fp16",
                          g.ta, g.tb, g.M, g.N, g.K, 0.f);
  Shape& s = shape_of(p, g);
  if (!s.found) {
    if (g.out_dt == DType::F32)
      fallback<F32Fmt, float>(g);
    else if (g.out_dt == DType::BF16)
      fallback<Bf16Fmt, std::uint16_t>(g);
    else
      fallback<Fp16Fmt, std::uint16_t>(g);
    return;
  }
  if (p.epilogue != Epilogue::None) set(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (p.epilogue == Epilogue::GeluAuxBias) set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  const float alpha = g.alpha, beta = 0.f;
  TRIDENT_CUBLASLT(cublasLtMatmul(lt_handle(), s.desc, &alpha, p.a, s.a, p.b, s.b, &beta, g.C, s.d, g.C, s.d, &s.algo,
                                  workspace(), kWorkspaceBytes, Kokkos::Cuda().cuda_stream()));
}

}  // namespace trident
