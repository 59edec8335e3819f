// Kernels of the 16-bit (bf16 / fp16) path. Activations that feed GEMMs, GEMM outputs kept for
// the backward pass and the model's parameters are stored as 16-bit words (HalfView, type given
// by a DType); arithmetic is fp32 inside every kernel, and results are rounded to nearest even
// when stored (as a GPU's conversion instructions do). LayerNorm statistics, softmax, the
// residual stream and all gradients stay fp32. Here: the conversions, and the GEMM output plus
// 16-bit bias stored in 16 bits.
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// out = round(in), n values
void pack_half(DType dt, const HalfView& out, const FloatView& in, std::int64_t n);
// out = float(in), n values (exact)
void unpack_half(DType dt, const FloatView& out, const HalfView& in, std::int64_t n);
// out (rows, cols) = round(y + bias): a GEMM's fp32 output with its 16-bit bias, stored in 16 bits
void add_bias_pack_half(DType dt, const HalfView& out, const FloatView& y, const HalfView& bias, std::int64_t rows,
                        std::int64_t cols);

// dbias (cols) += the column sums of dy (rows, cols), and dy16 = round(dy): a bias gradient and the
// 16-bit copy of the same gradient that the backward GEMMs read. Device kernels: one pass over dy
// (bias_backward's device layout, the same sums, with the copy written on the way: 2 launches for
// 3); host: bias_backward then pack_half, their bits.
void bias_backward_pack_half(DType dt, const FloatView& dbias, const HalfView& dy16, const FloatView& dy,
                             std::int64_t rows, std::int64_t cols);
// dbias (cols) += the column sums of the 16-bit dy16 (rows, cols) of type dt (widened exactly; an
// empty dbias: nothing), in column_sums' order on the device path: the bias gradient of a linear
// whose output gradient arrives in 16 bits (the cudnn attention's dq|dk|dv).
void bias_backward_half(DType dt, const FloatView& dbias, const HalfView& dy16, std::int64_t rows, std::int64_t cols);

// The other ops take Acts (fp32 or 16-bit) and choose their kernel inside (ops/layernorm.hpp,
// ops/gelu.hpp, ops/embedding.hpp, ops/attention.hpp, add_bias of ops/elementwise.hpp).

}  // namespace trident
