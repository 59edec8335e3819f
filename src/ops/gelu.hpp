// GELU, tanh approximation (GPT-2; docs/DESIGN.md "The model core"):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). gelu_tanh and gelu_tanh_grad (tanh by
// common/device_math's fast_tanh) are the one definition every kernel applies: fp32, 16-bit and
// the fused bias + GELU of ops/fused. Then the element-wise kernels over n values.
#pragma once
#include "common/device_math.hpp"
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// GELU, tanh form: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), and its derivative; shared by
// every kernel that applies it (fp32, 16-bit, fused bias + GELU).
KOKKOS_INLINE_FUNCTION float gelu_tanh(float v) {
  const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  return 0.5f * v * (1.f + fast_tanh(u));
}
KOKKOS_INLINE_FUNCTION float gelu_tanh_grad(float v) {
  const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  const float th = fast_tanh(u);
  const float du = 0.7978845608028654f * (1.f + 3.f * 0.044715f * v * v);
  return 0.5f * (1.f + th) + 0.5f * v * (1.f - th * th) * du;
}
// out = gelu(x), n values; out and x share one storage type (fp32 or bf16 / fp16 words).
void gelu_forward(const Act& out, const Act& x, std::int64_t n);
// dx = dout * gelu'(x)   (overwrites dx; gradients fp32, x fp32 or 16-bit)
void gelu_backward(const FloatView& dx, const FloatView& dout, const Act& x, std::int64_t n);
// The GELU's backward as the next linear layer's output gradient (the device path's MLP): dx16 (rows,
// cols) = round(dout * gelu'(x)) for 16-bit x (dt), and, with dbias not empty, dbias += the column
// sums of the unrounded dout * gelu'(x). Device kernels: one pass (column_sums' layout, the copy
// written on the way); host: gelu_backward, bias_backward and pack_half on a temporary.
void gelu_backward_pack_half(DType dt, const HalfView& dx16, const FloatView& dbias, const FloatView& dout,
                             const HalfView& x, std::int64_t rows, std::int64_t cols);
}  // namespace trident
