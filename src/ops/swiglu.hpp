// SwiGLU (Shazeer 2020, "GLU variants"; Llama, Mistral, Qwen; Megatron's --swiglu): of fc1's
// output row [gate | up] (F columns each), out = silu(gate) * up with silu(g) = g sigmoid(g).
// silu and its derivative are the one definition every kernel applies (fp32 and 16-bit).
#pragma once
#include "common/device_math.hpp"
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

KOKKOS_INLINE_FUNCTION float silu(float g) { return g / (1.f + dexp(-g)); }
// d silu / dg = s (1 + g (1 - s)), s = sigmoid(g)
KOKKOS_INLINE_FUNCTION float silu_grad(float g) {
  const float s = 1.f / (1.f + dexp(-g));
  return s * (1.f + g * (1.f - s));
}

// pre (rows, 2F) = y + bias (the bias (2F) as fc1's: gate's then up's), kept for the backward
// pass, and out (rows, F) = silu(pre_gate) * pre_up; y is the fp32 GEMM output (may be pre's own
// fp32 buffer). pre, out and bias share one storage type; in 16 bits out is computed from the
// rounded pre (as the unfused path would).
void bias_swiglu_forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
                         std::int64_t F);
// dpre (rows, 2F): d gate = dout up silu'(gate), d up = dout silu(gate) (overwrites; gradients fp32,
// pre fp32 or 16-bit)
void swiglu_backward(const FloatView& dpre, const FloatView& dout, const Act& pre, std::int64_t rows, std::int64_t F);
// The same written rounded to 16 bits (dt, pre's type) as the fc1 output gradient the backward
// GEMMs read: dpre16 = round(swiglu_backward), one kernel (the device path's MLP without a bias).
void swiglu_backward_pack_half(DType dt, const HalfView& dpre16, const FloatView& dout, const HalfView& pre,
                               std::int64_t rows, std::int64_t F);
// out (rows, F) = silu(pre_gate) * pre_up, fp32 (inference)
void swiglu_forward(const FloatView& out, const FloatView& pre, std::int64_t rows, std::int64_t F);

}  // namespace trident
