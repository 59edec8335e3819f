// GELU (tanh form) forward and backward.
#include "ops/gelu.hpp"

#include "common/device_math.hpp"

namespace trident {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;
}  // namespace

void gelu_forward(const FloatView& out, const FloatView& x, std::int64_t n) {
  Kokkos::parallel_for("ops::gelu_forward", range(n), KOKKOS_LAMBDA(std::int64_t i) {
    const float v = x(i);
    const float u = kSqrt2OverPi * (v + kCoeff * v * v * v);
    out(i) = 0.5f * v * (1.f + fast_tanh(u));
  });
}

void gelu_backward(const FloatView& dx, const FloatView& dout, const FloatView& x, std::int64_t n) {
  Kokkos::parallel_for("ops::gelu_backward", range(n), KOKKOS_LAMBDA(std::int64_t i) {
    const float v = x(i);
    const float u = kSqrt2OverPi * (v + kCoeff * v * v * v);
    const float th = fast_tanh(u);
    const float sech2 = 1.f - th * th;
    const float du = kSqrt2OverPi * (1.f + 3.f * kCoeff * v * v);
    dx(i) = dout(i) * (0.5f * (1.f + th) + 0.5f * v * sech2 * du);
  });
}

}  // namespace trident
