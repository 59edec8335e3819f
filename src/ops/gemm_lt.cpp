// gemm_lt (gemm_lt.hpp): the call's column-major plan, on every backend, and the host's
// implementation (a CUDA build's is gemm_lt_cuda.cpp): gemm_mixed into an fp32 buffer, then the
// epilogue on this rank's threads inside the same GEMM region, as the library's own work, not a
// kernel of its own.
#include "ops/gemm_lt.hpp"

#include <sstream>
#include <vector>

#include "common/device_math.hpp"
#include "common/error.hpp"
#include "ops/gelu.hpp"
#include "ops/gemm_region.hpp"

namespace trident {

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::Bias: return "bias";
    case Epilogue::GeluAuxBias: return "gelu_aux_bias";
  }
  return "?";
}

LtPlan lt_plan(const GemmLt& g) {
  LtPlan p;
  std::ostringstream why;
  if (g.M < 0 || g.N < 0 || g.K < 0) {
    why << "negative dimension M=" << g.M << " N=" << g.N << " K=" << g.K;
  } else if (g.A.dt != g.B.dt) {
    why << "operands of different types (" << dtype_name(g.A.dt) << ", " << dtype_name(g.B.dt) << ")";
  } else if (g.out_dt != DType::F32 && g.A.dt != g.out_dt) {
    why << "a " << dtype_name(g.out_dt) << " output of " << dtype_name(g.A.dt) << " operands";
  } else if (g.ldc < g.N) {
    why << "ldc " << g.ldc << " < N " << g.N;
  } else if (g.epilogue != Epilogue::None && g.bias == nullptr) {
    why << "epilogue " << epilogue_name(g.epilogue) << " without a bias";
  } else if (g.epilogue != Epilogue::None && g.bias_dt != g.out_dt && g.bias_dt != DType::F32) {
    why << "a " << dtype_name(g.bias_dt) << " bias for a " << dtype_name(g.out_dt) << " output";
  } else if (g.epilogue == Epilogue::GeluAuxBias && (g.aux == nullptr || g.ldaux < g.N)) {
    why << "epilogue gelu_aux_bias without its pre-activation output (aux, ldaux >= N)";
  }
  p.trans_a = g.tb == Trans::T;
  p.trans_b = g.ta == Trans::T;
  p.m = g.N;
  p.n = g.M;
  p.k = g.K;
  p.a_rows = p.trans_a ? g.K : g.N;  // op(A) is m x k
  p.a_cols = p.trans_a ? g.N : g.K;
  p.lda = g.ldb;
  p.b_rows = p.trans_b ? g.M : g.K;  // op(B) is k x n
  p.b_cols = p.trans_b ? g.K : g.M;
  p.ldb = g.lda;
  p.ldd = g.ldc;
  p.a = g.B.p;
  p.b = g.A.p;
  p.ab_dt = g.A.dt;
  p.d_dt = g.out_dt;
  p.epilogue = g.epilogue;
  p.bias_length = g.epilogue == Epilogue::None ? 0 : p.m;
  p.aux_ld = g.epilogue == Epilogue::GeluAuxBias ? g.ldaux : 0;
  if (why.str().empty() && p.m > 0 && p.k > 0 && (p.lda < p.a_rows || p.ldb < p.b_rows))
    why << "a leading dimension below its matrix's rows (lda " << g.lda << ", ldb " << g.ldb << ")";
  p.error = why.str();
  return p;
}

#if !defined(TRIDENT_ENABLE_CUDA)
namespace {
template <class F, class Out>
void epilogue(const GemmLt& g, const float* z, const Out* /*type*/) {
  Out* c = static_cast<Out*>(g.C);
  Out* aux = static_cast<Out*>(g.aux);
  const std::int64_t M = g.M, N = g.N;
  const auto bias = [&](std::int64_t j) -> float {
    if (g.epilogue == Epilogue::None) return 0.f;
    if (g.bias_dt == DType::F32) return static_cast<const float*>(g.bias)[j];
    return F::load(static_cast<const Out*>(g.bias)[j]);
  };
#if defined(TRIDENT_HOST_OPENMP)
#pragma omp parallel for if (M * N > 65536)
#endif
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const float t = z[i * N + j] + bias(j);
      if (g.epilogue == Epilogue::GeluAuxBias) {
        aux[i * g.ldaux + j] = F::store(t);
        c[i * g.ldc + j] = F::store(gelu_tanh(t));
      } else {
        c[i * g.ldc + j] = F::store(t);
      }
    }
}
const char* region_name(DType dt) {
  return dt == DType::F32 ? "ops::gemm_lt" : dt == DType::BF16 ? "ops::gemm_lt_bf16" : "ops::gemm_lt_fp16";
}
}  // namespace

void gemm_lt(const GemmLt& g) {
  const LtPlan p = lt_plan(g);
  if (!p.error.empty()) throw Error::one("gemm_lt: " + p.error);
  if (g.M == 0 || g.N == 0) return;
  const GemmRegion region(region_name(g.A.dt), g.ta, g.tb, g.M, g.N, g.K, 0.f);
  static std::vector<float> z;  // the fp32 products, grown to the largest call
  if (z.size() < static_cast<std::size_t>(g.M * g.N)) z.resize(static_cast<std::size_t>(g.M * g.N));
  gemm_mixed(g.ta, g.tb, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb, 0.f, z.data(), g.N);
  switch (g.out_dt) {
    case DType::F32: epilogue<F32Fmt>(g, z.data(), static_cast<const float*>(nullptr)); break;
    case DType::BF16: epilogue<Bf16Fmt>(g, z.data(), static_cast<const std::uint16_t*>(nullptr)); break;
    case DType::F16: epilogue<Fp16Fmt>(g, z.data(), static_cast<const std::uint16_t*>(nullptr)); break;
  }
}
#endif

}  // namespace trident
