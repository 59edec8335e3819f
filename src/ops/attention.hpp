// Core attention (no projections): causal softmax(Q K^T / sqrt(hs)) V over heads, with the
// batched GEMMs through ops/gemm. Head h of q/k/v is the contiguous block h*hs..(h+1)*hs-1 of
// the q, k and v thirds of each token's 3C-vector (Megatron/DESIGN.md qkv row order).
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"
#include "ops/dropout.hpp"

namespace trident {

struct AttentionShape {
  std::int64_t B, T, C, nh;  // batch, sequence, channels (of this rank's heads), heads
  std::int64_t hs() const { return C / nh; }
};

// qkv (B, T, 3C) -> y (B, T, C), the attention output before the projection; att (B, nh, T, T)
// keeps the probabilities. With dropout, att_drop (B, nh, T, T) receives the dropped-out
// probabilities (unused otherwise). Heads are addressed in place (strided GEMMs).
void attention_forward(const FloatView& y, const FloatView& qkv, const FloatView& att, const AttentionShape& s,
                       const DropoutSpec& drop = {}, const FloatView& att_drop = {});

// The two halves of attention_forward. attention_probs: att (B, nh, T, T) = causal
// softmax(q k^T / sqrt(hs)) and, with dropout, att_drop = dropout(att). Selective activation
// recomputation re-runs it in the backward pass instead of keeping att and att_drop.
void attention_probs(const FloatView& att, const FloatView& att_drop, const FloatView& qkv, const AttentionShape& s,
                     const DropoutSpec& drop = {});
// y (B, T, C) = probs v, per head (probs: att, or att_drop with dropout).
void attention_context(const FloatView& y, const FloatView& probs, const FloatView& qkv, const AttentionShape& s);

// dy (B, T, C) -> dqkv (B, T, 3C) (overwritten). Scratch: datt (B, nh, T, T).
void attention_backward(const FloatView& dqkv, const FloatView& dy, const FloatView& qkv, const FloatView& att,
                        const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop = {},
                        const FloatView& att_drop = {});

// ---- 16-bit twins (mixed precision): qkv, the probabilities (att, att_drop) and the output y
// are 16-bit words; the GEMMs take 16-bit inputs with fp32 accumulation; scores, softmax,
// dropout and every gradient are fp32. Workspaces: scores and att32 (B, nh, T, T) fp32, y32
// (B, T, C) fp32, dy16 (B, T, C) and ds16 (B, nh, T, T) 16-bit.
void attention_probs_half(DType dt, const HalfView& att, const HalfView& att_drop, const HalfView& qkv,
                          const FloatView& scores, const AttentionShape& s, const DropoutSpec& drop = {});
void attention_context_half(DType dt, const HalfView& y, const FloatView& y32, const HalfView& probs,
                            const HalfView& qkv, const AttentionShape& s);
void attention_backward_half(DType dt, const FloatView& dqkv, const FloatView& dy, const HalfView& qkv,
                             const HalfView& att, const HalfView& att_drop, const FloatView& datt,
                             const FloatView& att32, const HalfView& dy16, const HalfView& ds16,
                             const AttentionShape& s, const DropoutSpec& drop = {});

// Row-wise causal softmax in place over (rows of length T, row index i = row % T masks j > i).
void causal_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t T, float scale);
// datt <- att * (datt - sum_j datt*att) * scale  (in place in datt)
void causal_softmax_backward(const FloatView& datt, const FloatView& att, std::int64_t BH, std::int64_t T,
                             float scale);

}  // namespace trident
