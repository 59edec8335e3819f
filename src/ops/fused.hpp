// Fused elementwise kernels where Megatron fuses (bias_gelu_fusion, bias_dropout_add_fusion): one
// pass over memory instead of two or three. Each computes what its unfused sequence computes,
// the same float operations in the same order: bias + GELU is bitwise identical; in bias +
// dropout + add the compiler may contract the scaling and the add into one fused multiply-add
// (the unfused path rounds in between), a difference of at most one rounding (1 ulp).
#pragma once
#include "common/half.hpp"
#include "ops/dropout.hpp"

namespace trident {

// pre (rows, cols) = y + bias (kept for the GELU backward) and out = gelu(pre), from the fp32
// GEMM output y (which may be pre's own fp32 buffer); pre, out and bias are fp32 or 16-bit
// words of one type (16-bit: out = gelu of the rounded pre, as the unfused path computes).
void bias_gelu_forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
                       std::int64_t cols);

// out (rows, cols) = residual + dropout(branch + bias), all fp32 but the bias (fp32 or 16-bit).
// The dropout mask is element i's of a dropout call with spec d over the (rows, cols) branch.
// out may alias residual or branch.
void bias_dropout_add(const FloatView& out, const FloatView& residual, const FloatView& branch, const Act& bias,
                      std::int64_t rows, std::int64_t cols, const DropoutSpec& d);

// bias_dropout_add's backward into the branch's linear layer (the device path's row-parallel
// linears): dy16 (rows, cols) = round(dropout_backward(dout)) in the 16-bit type dt, and, with dbias
// not empty, dbias += the column sums of the unrounded values (the bias gradient). Device kernels:
// one pass (column_sums' layout, the copy written on the way; the same sums as dropout_backward
// then bias_backward); host: dropout_backward, bias_backward and pack_half on a temporary.
void dropout_backward_pack_half(DType dt, const HalfView& dy16, const FloatView& dbias, const FloatView& dout,
                                std::int64_t rows, std::int64_t cols, const DropoutSpec& d);

}  // namespace trident
