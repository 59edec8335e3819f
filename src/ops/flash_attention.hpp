// Fused core attention (FlashAttention-style): softmax(q k^T / sqrt(hs)) v per head with an
// online softmax over the keys, so the (T, T) score matrix is never stored; backward recomputes
// the probabilities from the per-row log-sum-exp (FlashAttention-2's scheme) in two passes, one
// over query rows (dq) and one over key rows (dk, dv), deterministic and without atomics.
// Causal and key-padding masks; attention dropout with the same counter-based masks as the
// unfused path (element (b, h, i, j) of the (B, nh, T, T) probabilities), so the two paths
// compute the same function. q, k, v are read in place from qkv (B, T, C + 2 Ckv) in fp32 or 16-bit
// words; y is stored in the same type; statistics and gradients are fp32.
#pragma once
#include "common/half.hpp"
#include "ops/attention.hpp"

namespace trident {

constexpr std::int64_t kFlashMaxHeadDim = 256;

// qkv (B, T, C + 2 Ckv) -> y (B, T, C); lse (B, nh, T) receives the log-sum-exp of each query row's
// scaled scores (-inf for a row without any key).
void flash_attention_forward(const Act& y, const FloatView& lse, const Act& qkv, const AttentionShape& s,
                             const DropoutSpec& drop = {}, const AttentionMask& mask = {});

// dy (B, T, C) fp32 -> dqkv (B, T, C + 2 Ckv) fp32 (overwritten); y and lse are the forward's; delta
// (B, nh, T) fp32 is a workspace.
void flash_attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& y,
                              const FloatView& lse, const FloatView& delta, const AttentionShape& s,
                              const DropoutSpec& drop = {}, const AttentionMask& mask = {});

}  // namespace trident
