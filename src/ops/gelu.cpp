// GELU (tanh form) forward and backward.
#include "ops/gelu.hpp"

#include "common/device_math.hpp"

namespace trident {

void gelu_forward(const FloatView& out, const FloatView& x, std::int64_t n) {
  Kokkos::parallel_for("ops::gelu_forward", range(n), KOKKOS_LAMBDA(std::int64_t i) {
    out(i) = gelu_tanh(x(i));
  });
}

void gelu_backward(const FloatView& dx, const FloatView& dout, const FloatView& x, std::int64_t n) {
  Kokkos::parallel_for("ops::gelu_backward", range(n), KOKKOS_LAMBDA(std::int64_t i) {
    dx(i) = dout(i) * gelu_tanh_grad(x(i));
  });
}

}  // namespace trident
