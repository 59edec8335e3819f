// LayerNorm over the last dimension of (N, C) rows with fp32 statistics (docs/DESIGN.md "Mixed
// precision"): forward saves each row's mean and 1/sqrt(var + eps) for backward, which adds the
// input gradient to dx (the residual stream's gradient) and accumulates dw and db. In 16 bits,
// out, w and b are bf16 / fp16 words; x, the statistics and the gradients stay fp32.
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"
#include "ops/fused.hpp"

namespace trident {

// out (N, C) = (x - mean) * rstd * w + b; saves mean (N) and rstd (N) for backward. out, w and b
// share one storage type (fp32, or bf16 / fp16 words: one kernel template for each). With pre on,
// x = pre.residual + dropout(pre.branch + pre.bias) is computed and stored first (ops/fused.hpp
// ResidualAdd: on the device path in the same kernel).
void layernorm_forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, const Act& w,
                       const Act& b, std::int64_t N, std::int64_t C, float eps, const ResidualAdd& pre = {});
// dx (N, C) += ...; dw (C) += ...; db (C) += ... (all fp32; w fp32 or 16-bit)
void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const Act& w, const FloatView& mean, const FloatView& rstd, std::int64_t N,
                        std::int64_t C);

}  // namespace trident
