// Softmax cross-entropy; one thread per row (token). The logits are large (tokens x vocabulary)
// and the op is bound by memory traffic, so each row is read once for the loss (online
// max/sum by blocks) and once more, with one write, for the gradient.
#include "ops/cross_entropy.hpp"

#include "common/device_math.hpp"

#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
#define TRIDENT_SIMD_SUM(var)
#define TRIDENT_SIMD_MAX(var)
#else
#define TRIDENT_PRAGMA(x) _Pragma(#x)
#define TRIDENT_SIMD_SUM(var) TRIDENT_PRAGMA(omp simd reduction(+ : var))
#define TRIDENT_SIMD_MAX(var) TRIDENT_PRAGMA(omp simd reduction(max : var))
#endif

namespace trident {

namespace {
constexpr std::int64_t kBlock = 64;  // elements per block of the one-pass (online) max/sum

template <bool kBackward>
void cross_entropy_impl(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                        std::int64_t V, std::int64_t Vp, float dscale) {
  Kokkos::parallel_for(kBackward ? "ops::cross_entropy_forward_backward" : "ops::cross_entropy_forward",
                       range(N), KOKKOS_LAMBDA(std::int64_t n) {
                         float* row = logits.data() + n * Vp;
                         // Pass 1, online softmax by blocks: running max mx and sum of exp(x - mx),
                         // rescaled when a block raises the max. The row is read once.
                         float mx = -3.0e38f, sum = 0.f;
                         for (std::int64_t b0 = 0; b0 < V; b0 += kBlock) {
                           const std::int64_t b1 = b0 + kBlock < V ? b0 + kBlock : V;
                           float bm = -3.0e38f;
                           TRIDENT_SIMD_MAX(bm)
                           for (std::int64_t j = b0; j < b1; ++j) bm = row[j] > bm ? row[j] : bm;
                           if (bm > mx) {
                             sum *= fast_exp(mx - bm);
                             mx = bm;
                           }
                           float bs = 0.f;
                           TRIDENT_SIMD_SUM(bs)
                           for (std::int64_t j = b0; j < b1; ++j) bs += fast_exp(row[j] - mx);
                           sum += bs;
                         }
                         const std::int64_t tgt = targets(n);
                         losses(n) = mx + dlog(sum) - row[tgt];
                         if (kBackward) {
                           // Pass 2: the gradient softmax * dscale - onehot * dscale, in place.
                           const float s = dscale / sum;
                           for (std::int64_t j = 0; j < V; ++j) row[j] = fast_exp(row[j] - mx) * s;
                           row[tgt] -= dscale;
                           for (std::int64_t j = V; j < Vp; ++j) row[j] = 0.f;
                         }
                       });
}
}  // namespace

void cross_entropy_forward(const FloatView& losses, const FloatView& logits, const IntView& targets,
                           std::int64_t N, std::int64_t V, std::int64_t Vp) {
  cross_entropy_impl<false>(losses, logits, targets, N, V, Vp, 0.f);
}

void cross_entropy_forward_backward(const FloatView& losses, const FloatView& logits, const IntView& targets,
                                    std::int64_t N, std::int64_t V, std::int64_t Vp, float dscale) {
  cross_entropy_impl<true>(losses, logits, targets, N, V, Vp, dscale);
}

double sum_losses(const FloatView& losses, std::int64_t N) {
  double total = 0;
  Kokkos::parallel_reduce(
      "ops::sum_losses", range(N), KOKKOS_LAMBDA(std::int64_t n, double& acc) { acc += losses(n); }, total);
  return total;
}

}  // namespace trident
