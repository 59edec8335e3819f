// Block kernels of context-parallel ring attention (parallel.cp_comm_type = p2p): causal
// self-attention of this rank's queries against one key/value block at a time, the blocks of all
// cp ranks in turn, with the partial results merged by their log-sum-exp (FlashAttention's online
// softmax carried across blocks). No communication here: layers/context_parallel moves the blocks.
//
// Load balance (Megatron's and torchtitan's zig-zag split): each sample's T positions form 2 cp
// chunks of c = T / (2 cp) positions; context-parallel rank r holds chunks r and 2 cp - 1 - r, its
// Tl = 2c rows per sample being chunk r then chunk 2 cp - 1 - r. Local row t of rank r is global
// position CpChunks::global(r, t). Query i attends to key j when pos(j) <= pos(i) and, with packed
// documents, pos(j) >= doc_start(i) (a global position). With KV from rank k: k = r gives the local
// causal block, k < r both query chunks against both key chunks' earlier part (chunk k unmasked,
// chunk 2cp-1-k only by the second query chunk), k > r only the second query chunk. Every rank
// computes the same number of unmasked query-key pairs (c^2 (2 cp) + c ... : see docs/DESIGN.md
// "Context parallelism").
//
// Attention dropout keeps the counter of a one-rank run: element (b, h, pos(i), pos(j)) of the
// (B, nh, T, T) probabilities, so that the masks do not depend on cp.
//
// Storage: q from this rank's qkv rows (B, Tl, C + 2 Ckv), keys and values from a block laid out
// as KvBlock says (this rank's own qkv, or a packed (B, Tl, 2 Ckv) buffer of another rank's), in
// fp32 or 16-bit words; the running output, statistics and every gradient are fp32.
#pragma once
#include "common/half.hpp"
#include "ops/attention.hpp"

namespace trident {

struct CpChunks {
  std::int64_t cp = 1;  // context-parallel size
  std::int64_t Tl = 0;  // rows per sample on a rank (= T / cp)
  KOKKOS_INLINE_FUNCTION std::int64_t chunk() const { return Tl / 2; }
  KOKKOS_INLINE_FUNCTION std::int64_t T() const { return Tl * cp; }
  // the global position of local row t of rank r
  KOKKOS_INLINE_FUNCTION std::int64_t global(std::int64_t r, std::int64_t t) const {
    const std::int64_t c = Tl / 2;
    return t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c);
  }
  // the chunk index of local half `half` (0 or 1) of rank r
  KOKKOS_INLINE_FUNCTION std::int64_t chunk_of(std::int64_t r, std::int64_t half) const {
    return half == 0 ? r : 2 * cp - 1 - r;
  }
};

// A key/value block: rows (B * Tl) of `ld` words, keys at koff and values at voff of each row
// (this rank's qkv: ld = C + 2 Ckv, koff = C, voff = C + Ckv; a packed buffer: ld = 2 Ckv, koff = 0,
// voff = Ckv), owned by context-parallel rank `rank`.
struct KvBlock {
  Act kv;
  std::int64_t ld = 0, koff = 0, voff = 0;
  std::int64_t rank = 0;
};

// A packed block (B * Tl, 2 Ckv) of this rank's keys | values out of qkv (B * Tl, C + 2 Ckv).
void ring_pack_kv(const Act& packed, const Act& qkv, const AttentionShape& s);

// Starts the merge: acc (B * Tl, C) = 0 and lse (B, nh, Tl) = "no key yet".
void ring_forward_begin(const FloatView& acc, const FloatView& lse, const AttentionShape& s);
// Attends this rank's queries (rank q_rank) to block kv and merges the block's normalised output
// and log-sum-exp into acc and lse.
void ring_forward_block(const FloatView& acc, const FloatView& lse, const Act& qkv, const KvBlock& kv,
                        std::int64_t q_rank, const CpChunks& cc, const AttentionShape& s, const DropoutSpec& drop,
                        const AttentionMask& mask);
// y (B * Tl, C) = acc in y's type; lse stays (the backward pass's).
void ring_forward_end(const Act& y, const FloatView& acc, const AttentionShape& s);

// Backward: delta (B, nh, Tl) = dy . y per query row; dq (the query columns of dqkv) = 0.
void ring_backward_begin(const FloatView& dqkv, const FloatView& delta, const FloatView& dy, const Act& y,
                         const AttentionShape& s);
// This rank's queries against block kv: adds into the query columns of dqkv and into dkv
// (B * Tl, 2 Ckv) fp32, the block's key | value gradients (which travel with the block).
void ring_backward_block(const FloatView& dqkv, const FloatView& dkv, const FloatView& dy, const Act& qkv,
                         const KvBlock& kv, const FloatView& lse, const FloatView& delta, std::int64_t q_rank,
                         const CpChunks& cc, const AttentionShape& s, const DropoutSpec& drop,
                         const AttentionMask& mask);
// The key and value columns of dqkv = dkv (this rank's block's gradients, home again).
void ring_backward_end(const FloatView& dqkv, const FloatView& dkv, const AttentionShape& s);

// ---- all-to-all over heads (cp_comm_type = a2a, DeepSpeed-Ulysses) -------------------------------
// The all-to-all turns this rank's Tl rows of every head into the whole sequence's T rows of
// 1/cp of the heads. A row of width `ld` is split into head groups by HeadSplit: group k (the
// part going to, or coming from, context-parallel rank k) is the columns [off[s] + k len[s],
// off[s] + (k + 1) len[s]) of each segment s, side by side (width(): the sum of len).
// qkv: segments q (off 0, len nh/cp hs), k (off C, len ng/cp hs), v (off C + Ckv, len ng/cp hs);
// the attention output and its gradient: one segment (off 0, len C/cp).
struct HeadSplit {
  int n = 0;
  std::int64_t off[3] = {0, 0, 0}, len[3] = {0, 0, 0};
  std::int64_t width() const { return len[0] + len[1] + len[2]; }
};
// send (cp, rows, width) <- src (rows, ld): group k of every row into block k (for rank k).
void cp_split_heads(const Act& send, const Act& src, std::int64_t rows, std::int64_t ld, const HeadSplit& hs,
                    std::int64_t cp);
void cp_split_heads(const FloatView& send, const FloatView& src, std::int64_t rows, std::int64_t ld,
                    const HeadSplit& hs, std::int64_t cp);
// dst (rows, ld) <- recv (cp, rows, width): block k (from rank k) into group k of every row.
void cp_merge_heads(const Act& dst, const Act& recv, std::int64_t rows, std::int64_t ld, const HeadSplit& hs,
                    std::int64_t cp);
void cp_merge_heads(const FloatView& dst, const FloatView& recv, std::int64_t rows, std::int64_t ld,
                    const HeadSplit& hs, std::int64_t cp);
// full (B, T, width) <- recv (cp, B Tl, width): rank k's local rows to their global positions.
void cp_gather_sequence(const Act& full, const Act& recv, std::int64_t B, const CpChunks& cc, std::int64_t width);
void cp_gather_sequence(const FloatView& full, const FloatView& recv, std::int64_t B, const CpChunks& cc,
                        std::int64_t width);
void cp_gather_sequence(const IntView& full, const IntView& recv, std::int64_t B, const CpChunks& cc,
                        std::int64_t width);
// send (cp, B Tl, width) <- full (B, T, width): the rows of rank k's positions into block k.
void cp_scatter_sequence(const Act& send, const Act& full, std::int64_t B, const CpChunks& cc, std::int64_t width);
void cp_scatter_sequence(const FloatView& send, const FloatView& full, std::int64_t B, const CpChunks& cc,
                         std::int64_t width);

}  // namespace trident
