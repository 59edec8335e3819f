// Core attention (no projections): softmax(Q K^T / sqrt(hs)) V over heads under a causal mask
// (GPT, the T5 decoder) or a key-padding mask (BERT, the T5 encoder), with the batched GEMMs
// through ops/gemm. Self-attention: each token's row of qkv is [q (C) | k (Ckv) | v (Ckv)] with
// C = nh hs and Ckv = ng hs (Ckv = C without grouped-query attention); query head h is the
// contiguous block h*hs..(h+1)*hs-1 of q, and reads key/value group g = h / (nh / ng), the block
// g*hs.. of k and of v (docs/DESIGN.md qkv row order).
// Cross-attention (T5's decoder over the encoder output; the key-value cache): queries q (B, T, C)
// of one sequence, keys and values kv (B, Tk, 2 Ckv) of another, the k half then the v half of
// each row.
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"
#include "ops/dropout.hpp"

namespace trident {

struct AttentionShape {
  std::int64_t B, T, C, nh;  // batch, sequence (of the queries), channels (of this rank's heads), heads
  std::int64_t Tk = 0;       // cross-attention: keys per sample (0: T, self-attention)
  // cross-attention: rows per sample in the k|v buffer (0: Tk); larger for a key-value cache that
  // holds up to kv_stride positions per sample of which the first Tk are used
  std::int64_t kv_stride = 0;
  // key/value heads (grouped-query attention: query head h reads group h / (nh / ng)); 0: nh
  std::int64_t ng = 0;
  std::int64_t hs() const { return C / nh; }
  std::int64_t groups() const { return ng > 0 ? ng : nh; }
  std::int64_t rep() const { return nh / groups(); }     // query heads per group
  std::int64_t kv_C() const { return groups() * hs(); }  // channels of the keys (and of the values)
  std::int64_t keys() const { return Tk > 0 ? Tk : T; }
  std::int64_t kv_rows() const { return kv_stride > 0 ? kv_stride : keys(); }
};

// Which keys a query attends to. Masked scores get probability 0 (not a large negative
// number), so a query row without any valid key has all-zero probabilities and a zero output
// in both the unfused and the fused path.
struct AttentionMask {
  bool causal = true;
  // (B * Tk): key t of sample b is attended to only when key_valid(b * Tk + t) != 0 (padding
  // mask); empty: every key.
  IntView key_valid;
  // Self-attention over packed documents (B * T): query i of sample b attends only to keys
  // j >= doc_start(b * T + i), the first position of its document (Megatron's
  // --reset-attention-mask); empty: no document bound.
  IntView doc_start;
  // (B), where given with key_valid: every sample's valid keys are its first key_len(b) >= 1 (the
  // same mask as one length per sample: cuDNN's padding mask, ops/sdpa). Trident's kernels read
  // key_valid.
  IntView key_len;
};

// Storage: the activations (qkv, q, kv, the probabilities att and att_drop, the output y) are
// Acts, fp32 or bf16 / fp16 words alike (each call checks they share one type and dispatches
// once). In 16 bits the GEMMs take 16-bit inputs with fp32 accumulation, and scores, softmax,
// dropout and every gradient stay fp32 in the scratch below (docs/DESIGN.md "Mixed precision").
struct AttentionScratch {
  FloatView scores;  // (B, nh, T, Tk) fp32 scores, then probabilities (probs)
  FloatView att32;   // (B, nh, T, Tk) the stored probabilities widened (backward)
  FloatView y32;     // (B, T, C) the fp32 GEMM output (context)
  HalfView dy16;     // (B, T, C) dy in 16 bits (backward)
  HalfView ds16;     // (B, nh, T, Tk) the score gradient in 16 bits (backward)
};

// qkv (B, T, C + 2 Ckv) -> y (B, T, C), the attention output before the projection; att (B, nh, T, T)
// keeps the probabilities. With dropout, att_drop (B, nh, T, T) receives the dropped-out
// probabilities (unused otherwise). Heads are addressed in place (strided GEMMs). fp32 only.
void attention_forward(const FloatView& y, const FloatView& qkv, const FloatView& att, const AttentionShape& s,
                       const DropoutSpec& drop = {}, const FloatView& att_drop = {}, const AttentionMask& mask = {});

// The two halves of the forward pass. attention_probs: att (B, nh, T, T) = masked
// softmax(q k^T / sqrt(hs)) and, with dropout, att_drop = dropout(att). Selective activation
// recomputation re-runs it in the backward pass instead of keeping att and att_drop.
void attention_probs(const Act& att, const Act& att_drop, const Act& qkv, const AttentionShape& s,
                     const DropoutSpec& drop = {}, const AttentionMask& mask = {},
                     const AttentionScratch& scratch = {});
// y (B, T, C) = probs v, per head (probs: att, or att_drop with dropout).
void attention_context(const Act& y, const Act& probs, const Act& qkv, const AttentionShape& s,
                       const AttentionScratch& scratch = {});

// dy (B, T, C) -> dqkv (B, T, C + 2 Ckv) (fp32, overwritten). Scratch: datt (B, nh, T, T) fp32.
void attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& att, const Act& att_drop,
                        const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop = {},
                        const AttentionMask& mask = {}, const AttentionScratch& scratch = {});

// ---- cross-attention (s.Tk keys per sample; probabilities (B, nh, T, Tk)); the same
// contracts as the self-attention functions, with the query and key/value gradients in dq
// (B, T, C) and dkv (B, Tk, 2 Ckv) (both fp32, overwritten).
void cross_attention_probs(const Act& att, const Act& att_drop, const Act& q, const Act& kv, const AttentionShape& s,
                           const DropoutSpec& drop = {}, const AttentionMask& mask = {},
                           const AttentionScratch& scratch = {});
void cross_attention_context(const Act& y, const Act& probs, const Act& kv, const AttentionShape& s,
                             const AttentionScratch& scratch = {});
void cross_attention_backward(const FloatView& dq, const FloatView& dkv, const FloatView& dy, const Act& q,
                              const Act& kv, const Act& att, const Act& att_drop, const FloatView& datt,
                              const AttentionShape& s, const DropoutSpec& drop = {}, const AttentionMask& mask = {},
                              const AttentionScratch& scratch = {});

// ---- key-value cache (generation): the attention of new queries over every cached position is
// the cross-attention above with kv = the cache (AttentionShape::kv_stride = L positions per
// sample). kv_cache_store splits R = B n rows of qkv (R, C + 2 Ckv) -- sample r / n at position
// positions(r) -- into the queries q (R, C) and the sample's cache rows (B, L, 2 Ckv) (k | v): the
// cache holds the key/value groups only.
void kv_cache_store(const FloatView& q, const FloatView& cache, const FloatView& qkv, const IntView& positions,
                    std::int64_t R, std::int64_t n, std::int64_t L, std::int64_t C, std::int64_t Ckv);

// Row-wise masked softmax in place over BH * Tq rows of length Tk (row r: sample r / (nh Tq),
// query i = r % Tq): the causal mask drops keys j > i, the padding mask keys with key_valid 0.
void masked_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t Tq, std::int64_t Tk, std::int64_t nh,
                            float scale, const AttentionMask& mask);
// datt <- att * (datt - sum_j datt*att) * scale  (in place in datt; masked keys get 0)
void masked_softmax_backward(const FloatView& datt, const FloatView& att, std::int64_t BH, std::int64_t Tq,
                             std::int64_t Tk, float scale, bool causal);

// The 16-bit path's probabilities in one kernel each on the device (kDeviceKernels), the bits of
// the sequences they replace (unit Attention.HalfSoftmaxKernelsGiveTheBitsOfTheirSequences):
// - forward: att16 = round(masked_softmax_forward(scores)) and, with drop active, att_drop16 =
//   round(dropout_forward(that)); scores (fp32) is the kernel's scratch and is overwritten;
// - backward: ds16 = round(masked_softmax_backward(dropout_backward(datt), float(att16))); datt is
//   left as it was on the device and overwritten on the host.
// The dropout's counters are the elements' indices (drop not mapped). dt: the 16-bit type.
void masked_softmax_forward_half(DType dt, const FloatView& scores, const HalfView& att16, const HalfView& att_drop16,
                                 std::int64_t BH, std::int64_t Tq, std::int64_t Tk, std::int64_t nh, float scale,
                                 const AttentionMask& mask, const DropoutSpec& drop);
void masked_softmax_backward_half(DType dt, const FloatView& datt, const HalfView& att16, const HalfView& ds16,
                                  std::int64_t BH, std::int64_t Tq, std::int64_t Tk, float scale, bool causal,
                                  const DropoutSpec& drop);

}  // namespace trident
