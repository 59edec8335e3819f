// Kernels of the 16-bit (bf16 / fp16) path. Activations that feed GEMMs, GEMM outputs kept for
// the backward pass and the model's parameters are stored as 16-bit words (HalfView, type given
// by a DType); arithmetic is fp32 inside every kernel, and results are rounded to nearest even
// when stored (as a GPU's conversion instructions do). LayerNorm statistics, softmax, the
// residual stream and all gradients stay fp32. Each function here is the 16-bit twin of the fp32
// op of the same name (ops/layernorm, ops/gelu, ops/embedding, ops/elementwise).
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
// y (rows, cols) += bias (16-bit), fp32 result
void add_bias_half(DType dt, const FloatView& y, const HalfView& bias, std::int64_t rows, std::int64_t cols);

// LayerNorm of the fp32 x (N, C) with 16-bit weight and bias; out stored in 16 bits, mean and
// rstd fp32.
void layernorm_forward_half(DType dt, const HalfView& out, const FloatView& mean, const FloatView& rstd,
                            const FloatView& x, const HalfView& w, const HalfView& b, std::int64_t N, std::int64_t C,
                            float eps);
// dx += ..., dw, db (fp32 main gradients) += ..., from the fp32 dout; w is 16-bit.
void layernorm_backward_half(DType dt, const FloatView& dx, const FloatView& dw, const FloatView& db,
                             const FloatView& dout, const FloatView& x, const HalfView& w, const FloatView& mean,
                             const FloatView& rstd, std::int64_t N, std::int64_t C);

void gelu_forward_half(DType dt, const HalfView& out, const HalfView& x, std::int64_t n);
void gelu_backward_half(DType dt, const FloatView& dx, const FloatView& dout, const HalfView& x, std::int64_t n);

// Vocabulary-parallel lookup from a 16-bit table into fp32 rows; positions from a 16-bit table.
void embedding_lookup_half(DType dt, const FloatView& out, const IntView& tokens, const HalfView& wte,
                           std::int64_t start, std::int64_t rows_local, std::int64_t N, std::int64_t C);
void add_positions_half(DType dt, const FloatView& x, const HalfView& wpe, std::int64_t row0, std::int64_t R,
                        std::int64_t T, std::int64_t C);

}  // namespace trident
