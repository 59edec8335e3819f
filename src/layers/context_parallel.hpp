// Context parallelism's attention (parallel.cp > 1, docs/DESIGN.md "Context parallelism"): each of
// the cp ranks of a context-parallel group holds Tl = T / cp rows of every sample (the zig-zag
// chunks of ops/ring_attention.hpp) and the layers around attention work on them alone.
//
// Ring attention (cp_comm_type = p2p): the key/value blocks travel around the ring
// r -> r + 1 while each rank attends its queries to the block it holds, merging the partial
// outputs by their log-sum-exp; the next block is sent while this one is computed (comm/'s
// non-blocking point-to-point). Backward: the blocks travel again, each with the key/value
// gradients accumulated so far, and after cp steps every rank holds its own block's gradients.
// Grouped-query attention sends the key/value groups only; bf16/fp16 blocks travel in 16 bits.
#pragma once
#include "comm/communicator.hpp"
#include "common/half.hpp"
#include "ops/attention.hpp"

namespace trident {

// Buffers of one layer's ring (shared by the layers of a chunk): two key/value blocks in the
// activations' type and two fp32 key/value gradient blocks, (B * Tl, 2 Ckv) each, and the fp32
// running output (B * Tl, C).
struct RingScratch {
  Act kv[2];
  FloatView dkv[2];
  FloatView acc;
  RingScratch() = default;
  RingScratch(DType dt, std::int64_t rows, std::int64_t q_cols, std::int64_t kv_cols);
  std::int64_t bytes() const;
};

// y (B * Tl, C), lse (B, nh, Tl) from qkv (B * Tl, C + 2 Ckv) of this rank's rows, attending to
// the keys of the whole sequences held by the group `cp` (causal; mask.doc_start, when given, in
// global positions).
void ring_attention_forward(const Act& y, const FloatView& lse, const Act& qkv, const AttentionShape& s,
                            const DropoutSpec& drop, const AttentionMask& mask, const Communicator& cp, RingScratch& w);
// dy (B * Tl, C) fp32 -> dqkv (B * Tl, C + 2 Ckv) fp32 (overwritten); delta (B, nh, Tl) workspace.
void ring_attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& y,
                             const FloatView& lse, const FloatView& delta, const AttentionShape& s,
                             const DropoutSpec& drop, const AttentionMask& mask, const Communicator& cp,
                             RingScratch& w);

// All-to-all over heads (cp_comm_type = a2a, DeepSpeed-Ulysses): qkv's rows of this rank become
// the whole sequences' rows of 1/cp of the heads (its query heads and key/value groups
// [rank/cp, (rank+1)/cp) of this tensor-parallel rank's), the fused kernel attends over the whole
// sequences, and the outputs go back the same way; the backward pass exchanges qkv, y and dy
// again (nothing of the exchanged layout is kept between the passes) and returns dqkv. The query
// heads and the key/value groups of a tensor-parallel rank must be divisible by cp (the deck checks).
struct UlyssesScratch {
  Act send, recv;            // (B Tl W) words of the activations' type: qkv and y messages
  FloatView send32, recv32;  // (B Tl W) fp32: dy and dqkv messages
  Act qkv_sub, y_sub;        // (B, T, W / cp), (B, T, C / cp)
  FloatView dy_sub, dqkv_sub;
  IntView docs_local, docs_all, doc_full;  // packed documents' starts: (B Tl), (cp B Tl), (B T)
  UlyssesScratch() = default;
  UlyssesScratch(DType dt, std::int64_t rows, std::int64_t q_cols, std::int64_t qkv_cols, int cp);
  std::int64_t bytes() const;
};

void ulysses_attention_forward(const Act& y, const FloatView& lse, const Act& qkv, const AttentionShape& s,
                               const DropoutSpec& drop, const AttentionMask& mask, const Communicator& cp,
                               UlyssesScratch& w);
void ulysses_attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& y,
                                const FloatView& lse, const FloatView& delta, const AttentionShape& s,
                                const DropoutSpec& drop, const AttentionMask& mask, const Communicator& cp,
                                UlyssesScratch& w);

}  // namespace trident
