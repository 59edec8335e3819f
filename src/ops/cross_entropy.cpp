// Softmax cross-entropy; one thread per row (token).
#include "ops/cross_entropy.hpp"

#include "common/device_math.hpp"

namespace trident {

namespace {
template <bool kBackward>
void cross_entropy_impl(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                        std::int64_t V, std::int64_t Vp, float dscale) {
  Kokkos::parallel_for(kBackward ? "ops::cross_entropy_forward_backward" : "ops::cross_entropy_forward",
                       range(N), KOKKOS_LAMBDA(std::int64_t n) {
                         const std::int64_t base = n * Vp;
                         float mx = -3.0e38f;
                         for (std::int64_t j = 0; j < V; ++j) mx = dmax(mx, logits(base + j));
                         float sum = 0.f;
                         for (std::int64_t j = 0; j < V; ++j) sum += dexp(logits(base + j) - mx);
                         const std::int64_t tgt = targets(n);
                         const float logz = mx + dlog(sum);
                         losses(n) = logz - logits(base + tgt);
                         if (kBackward) {
                           const float inv = 1.f / sum;
                           for (std::int64_t j = 0; j < V; ++j)
                             logits(base + j) = dexp(logits(base + j) - mx) * inv * dscale;
                           logits(base + tgt) -= dscale;
                           for (std::int64_t j = V; j < Vp; ++j) logits(base + j) = 0.f;
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
