// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include "common/types.hpp"

namespace trident {
void gelu_forward(const FloatView& out, const FloatView& x, std::int64_t n);
// dx = dout * gelu'(x)   (overwrites dx)
void gelu_backward(const FloatView& dx, const FloatView& dout, const FloatView& x, std::int64_t n);
}  // namespace trident
