// LayerNorm forward/backward. One thread per row for the row-wise parts, one thread per
// channel for the parameter gradients (deterministic, no atomics).
#include "ops/layernorm.hpp"

#include "common/device_math.hpp"

namespace trident {

void layernorm_forward(const FloatView& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
                       const FloatView& w, const FloatView& b, std::int64_t N, std::int64_t C, float eps) {
  Kokkos::parallel_for("ops::layernorm_forward", range(N), KOKKOS_LAMBDA(std::int64_t n) {
    const std::int64_t base = n * C;
    float m = 0.f;
    for (std::int64_t c = 0; c < C; ++c) m += x(base + c);
    m /= C;
    float v = 0.f;
    for (std::int64_t c = 0; c < C; ++c) {
      const float d = x(base + c) - m;
      v += d * d;
    }
    v /= C;
    const float r = 1.f / dsqrt(v + eps);
    for (std::int64_t c = 0; c < C; ++c) out(base + c) = (x(base + c) - m) * r * w(c) + b(c);
    mean(n) = m;
    rstd(n) = r;
  });
}

void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const FloatView& w, const FloatView& mean, const FloatView& rstd,
                        std::int64_t N, std::int64_t C) {
  Kokkos::parallel_for("ops::layernorm_backward_input", range(N), KOKKOS_LAMBDA(std::int64_t n) {
    const std::int64_t base = n * C;
    const float m = mean(n), r = rstd(n);
    // dnorm = dout * w;  dx = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    float mean_d = 0.f, mean_dx = 0.f;
    for (std::int64_t c = 0; c < C; ++c) {
      const float xhat = (x(base + c) - m) * r;
      const float dn = dout(base + c) * w(c);
      mean_d += dn;
      mean_dx += dn * xhat;
    }
    mean_d /= C;
    mean_dx /= C;
    for (std::int64_t c = 0; c < C; ++c) {
      const float xhat = (x(base + c) - m) * r;
      const float dn = dout(base + c) * w(c);
      dx(base + c) += r * (dn - mean_d - xhat * mean_dx);
    }
  });
  Kokkos::parallel_for("ops::layernorm_backward_params", range(C), KOKKOS_LAMBDA(std::int64_t c) {
    float sw = 0.f, sb = 0.f;
    for (std::int64_t n = 0; n < N; ++n) {
      const float xhat = (x(n * C + c) - mean(n)) * rstd(n);
      sw += dout(n * C + c) * xhat;
      sb += dout(n * C + c);
    }
    dw(c) += sw;
    db(c) += sb;
  });
}

}  // namespace trident
