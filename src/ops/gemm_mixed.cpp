// GEMMs over operands of a run-time type (GemmOperand, ops/gemm.hpp), built on every backend:
// gemm_mixed sends two operands of one type to gemm (fp32), gemm_bf16 or gemm_fp16, always with
// an fp32 C, and refuses mixed types; the strided-batched variant uses the batched GEMM of fp32
// and bf16 and loops over the batch for fp16 (docs/DESIGN.md "Mixed precision").
#include <algorithm>
#include <sstream>

#include "common/error.hpp"
#include "common/types.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_region.hpp"

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

std::int64_t GemmBatch::products() const {
  std::int64_t n = 1;
  for (const GemmBatchLevel& l : levels) n *= l.count;
  return n;
}

void GemmBatch::offsets(std::int64_t p, std::int64_t& a, std::int64_t& b, std::int64_t& c) const {
  a = b = c = 0;
  for (auto l = levels.rbegin(); l != levels.rend(); ++l) {
    const std::int64_t i = p % l->count;
    p /= l->count;
    a += i * l->a;
    b += i * l->b;
    c += i * l->c;
  }
}

GemmBatch GemmBatch::merged() const {
  GemmBatch out;
  for (const GemmBatchLevel& l : levels)
    if (l.count != 1) out.levels.push_back(l);
  // fold from the inside out: level k into level k + 1 where k's strides continue k + 1's
  for (std::size_t k = out.levels.size(); k-- > 1;) {
    const GemmBatchLevel outer = out.levels[k - 1], inner = out.levels[k];
    if (outer.a == inner.a * inner.count && outer.b == inner.b * inner.count && outer.c == inner.c * inner.count) {
      out.levels[k - 1] = {outer.count * inner.count, inner.a, inner.b, inner.c};
      out.levels.erase(out.levels.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return out;
}

void GemmBatch::check_outputs() const {
  for (const GemmBatchLevel& l : levels)
    if (l.count < 0) {
      std::ostringstream os;
      os << "internal: gemm_mixed_batched: a batch level of count " << l.count;
      throw Error::one(os.str());
    }
  const std::int64_t n = products();
  std::vector<std::pair<std::int64_t, std::int64_t>> c(static_cast<std::size_t>(n));  // (offset, product)
  for (std::int64_t p = 0; p < n; ++p) {
    std::int64_t a = 0, b = 0;
    offsets(p, a, b, c[static_cast<std::size_t>(p)].first);
    c[static_cast<std::size_t>(p)].second = p;
  }
  std::sort(c.begin(), c.end());
  for (std::size_t i = 1; i < c.size(); ++i)
    if (c[i].first == c[i - 1].first) {
      std::ostringstream os;
      os << "internal: gemm_mixed_batched: products " << c[i - 1].second << " and " << c[i].second
         << " of the batch write the same C (offset " << c[i].first << ")";
      throw Error::one(os.str());
    }
}

const char* gemm_batched_region(DType dt) {
  return dt == DType::F32    ? "ops::gemm_batched"
         : dt == DType::BF16 ? "ops::gemm_bf16_batched"
                             : "ops::gemm_fp16_batched";
}

#if !defined(TRIDENT_ENABLE_CUDA)
void gemm_mixed_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, GemmOperand A,
                        std::int64_t lda, GemmOperand B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
                        const GemmBatch& batch) {
  batch.check_outputs();
  const std::int64_t n = batch.products();
  if (M == 0 || N == 0 || n == 0) return;
  const GemmRegion region(gemm_batched_region(A.dt), ta, tb, M, N, K, beta, n);
  if (batch.levels.empty()) {
    gemm_mixed(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // the outer levels as one product index, the innermost as the strided batch
  const GemmBatchLevel& in = batch.levels.back();
  GemmBatch outer{std::vector<GemmBatchLevel>(batch.levels.begin(), batch.levels.end() - 1)};
  for (std::int64_t p = 0, m = outer.products(); p < m; ++p) {
    std::int64_t a = 0, b = 0, c = 0;
    outer.offsets(p, a, b, c);
    gemm_mixed_strided_batched(ta, tb, M, N, K, alpha, A.at(a), lda, in.a, B.at(b), ldb, in.b, beta, C + c, ldc, in.c,
                               in.count);
  }
}
#endif

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
