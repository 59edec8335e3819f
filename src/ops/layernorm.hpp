// LayerNorm over the last dimension of (N, C) rows with fp32 statistics (docs/DESIGN.md "Mixed
// precision"): forward saves each row's mean and 1/sqrt(var + eps) for backward, which adds the
// input gradient to dx (the residual stream's gradient) and accumulates dw and db. The 16-bit
// twins store out, w and b as bf16 / fp16 words; x, the statistics and the gradients stay fp32.
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// out (N, C) = (x - mean) * rstd * w + b; saves mean (N) and rstd (N) for backward.
void layernorm_forward(const FloatView& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
                       const FloatView& w, const FloatView& b, std::int64_t N, std::int64_t C, float eps);
// dx (N, C) += ...; dw (C) += ...; db (C) += ...
void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const FloatView& w, const FloatView& mean, const FloatView& rstd,
                        std::int64_t N, std::int64_t C);

// 16-bit twins (the same kernels): out, w, b as bf16 / fp16 words; x, statistics, gradients fp32.
void layernorm_forward_half(DType dt, const HalfView& out, const FloatView& mean, const FloatView& rstd,
                            const FloatView& x, const HalfView& w, const HalfView& b, std::int64_t N, std::int64_t C,
                            float eps);
void layernorm_backward_half(DType dt, const FloatView& dx, const FloatView& dw, const FloatView& db,
                             const FloatView& dout, const FloatView& x, const HalfView& w, const FloatView& mean,
                             const FloatView& rstd, std::int64_t N, std::int64_t C);

}  // namespace trident
