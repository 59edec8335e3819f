// RMSNorm over the last dimension of (N, C) rows (Zhang & Sennrich 2019; Llama, Mistral, Qwen;
// Megatron's --normalization RMSNorm): out = x / sqrt(mean(x^2) + eps) * w, no mean subtracted and
// no bias. Statistics fp32; forward saves each row's 1/sqrt(mean(x^2) + eps) for backward, which
// adds the input gradient to dx and accumulates dw. In 16 bits out and w are bf16 / fp16 words;
// x, the statistic and the gradients stay fp32 (as ops/layernorm).
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"
#include "ops/fused.hpp"

namespace trident {

// out (N, C) = x * rstd * w; saves rstd (N). out and w share one storage type. With pre on, x is
// the residual add's result, computed and stored first (as layernorm_forward).
void rmsnorm_forward(const Act& out, const FloatView& rstd, const FloatView& x, const Act& w, std::int64_t N,
                     std::int64_t C, float eps, const ResidualAdd& pre = {});
// dx (N, C) += d out/dx applied to dout; dw (C) += sum over rows of dout * x * rstd (fp32; w fp32 or
// 16-bit)
void rmsnorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& dout, const FloatView& x, const Act& w,
                      const FloatView& rstd, std::int64_t N, std::int64_t C);

}  // namespace trident
