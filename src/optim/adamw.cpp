// AdamW kernel.
#include "optim/adamw.hpp"

#include <cmath>

#include "common/device_math.hpp"
#include "common/simd.hpp"
#include "ops/elementwise.hpp"

namespace trident {

AdamW::AdamW(const AdamWConfig& cfg, std::int64_t n, std::int64_t decay_size, std::int64_t begin)
    : cfg_(cfg), n_(n), decay_size_(decay_size), begin_(begin), m_(make_float("adamw::exp_avg", n)), v_(make_float("adamw::exp_avg_sq", n)) {}

void AdamW::step(const FloatView& params, const FloatView& grads, double lr, float grad_scale) {
  ++step_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(step_)));
  const float sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(cfg_.beta2, static_cast<double>(step_))));
  const float step_size = static_cast<float>(lr) / bc1;
  const float decay = static_cast<float>(1.0 - lr * cfg_.weight_decay);
  // weight decay on the flat prefix [0, decay_size): local indices below nd
  const std::int64_t nd = decay_size_ - begin_;
  float* p = params.data() + begin_;
  const float* g = grads.data() + begin_;
  float* m = m_.data();
  float* v = v_.data();
  const std::int64_t n = n_;
  // One thread per chunk of kChunk elements; the inner loop is branch-free and marked for
  // vectorisation (the update is bound by memory traffic: 7 floats per parameter).
  constexpr std::int64_t kChunk = 4096;
  Kokkos::parallel_for("optim::adamw_step", range((n + kChunk - 1) / kChunk), KOKKOS_LAMBDA(std::int64_t c) {
    const std::int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
    TRIDENT_SIMD
    for (std::int64_t i = b; i < e; ++i) {
      const float gi = g[i] * grad_scale;
      const float pi = p[i] * (i < nd ? decay : 1.f);
      const float mi = b1 * m[i] + (1.f - b1) * gi;
      const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = pi - step_size * mi / (dsqrt(vi) / sqrt_bc2 + eps);
    }
  });
  Kokkos::fence();
}

double grad_norm_squared(const FloatView& grads, std::int64_t n) { return sum_squares(grads, n); }

}  // namespace trident
