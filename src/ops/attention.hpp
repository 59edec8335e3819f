// Core attention (no projections): causal softmax(Q K^T / sqrt(hs)) V over heads, with the
// batched GEMMs through ops/gemm. Head h of q/k/v is the contiguous block h*hs..(h+1)*hs-1 of
// the q, k and v thirds of each token's 3C-vector (Megatron/DESIGN.md qkv row order).
#pragma once
#include "common/types.hpp"
#include "ops/dropout.hpp"

namespace trident {

struct AttentionShape {
  std::int64_t B, T, C, nh;  // batch, sequence, channels (of this rank's heads), heads
  std::int64_t hs() const { return C / nh; }
};

// qkv (B, T, 3C) -> q, k, v (B, nh, T, hs) each; att (B, nh, T, T) probabilities;
// y (B, T, C) attention output before the projection. With dropout, att_drop (B, nh, T, T)
// receives the dropped-out probabilities (unused otherwise).
void attention_forward(const FloatView& y, const FloatView& q, const FloatView& k, const FloatView& v,
                       const FloatView& att, const FloatView& yperm, const FloatView& qkv,
                       const AttentionShape& s, const DropoutSpec& drop = {}, const FloatView& att_drop = {});

// dy (B, T, C) -> dqkv (B, T, 3C) (overwritten). Scratch: dyperm (B,nh,T,hs), datt (B,nh,T,T),
// dq, dk, dv (B,nh,T,hs).
void attention_backward(const FloatView& dqkv, const FloatView& dy, const FloatView& q, const FloatView& k,
                        const FloatView& v, const FloatView& att, const FloatView& dyperm, const FloatView& datt,
                        const FloatView& dq, const FloatView& dk, const FloatView& dv, const AttentionShape& s,
                        const DropoutSpec& drop = {}, const FloatView& att_drop = {});

// Row-wise causal softmax in place over (rows of length T, row index i = row % T masks j > i).
void causal_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t T, float scale);
// datt <- att * (datt - sum_j datt*att) * scale  (in place in datt)
void causal_softmax_backward(const FloatView& datt, const FloatView& att, std::int64_t BH, std::int64_t T,
                             float scale);

}  // namespace trident
