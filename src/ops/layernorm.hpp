// LayerNorm over the last dimension, statistics in fp32.
#pragma once
#include "common/types.hpp"

namespace trident {

// out (N, C) = (x - mean) * rstd * w + b; saves mean (N) and rstd (N) for backward.
void layernorm_forward(const FloatView& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
                       const FloatView& w, const FloatView& b, std::int64_t N, std::int64_t C, float eps);
// dx (N, C) += ...; dw (C) += ...; db (C) += ...
void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const FloatView& w, const FloatView& mean, const FloatView& rstd,
                        std::int64_t N, std::int64_t C);

}  // namespace trident
