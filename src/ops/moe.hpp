// Mixture-of-experts kernels (docs/DESIGN.md "Mixture of experts"; Megatron-core's TopKRouter and
// token permutation, moe/router.py and moe/moe_utils.py):
//
//   routing   logits (R, E) fp32 -> each token's k experts and their probabilities
//   plan      (host) the permutation of the (token, expert) selections grouped by expert, expert
//             by expert and token by token in each, with capacity drops
//   gather    permuted rows xp (N, C) from the tokens' rows
//   combine   out[t] = sum over the token's kept selections j of probs[t, j] yp[row(t, j)]
//
// Ties in a top-k go to the lower expert index (the routing) and, among tokens of one expert,
// to the lower token index (capacity drops by probability). Every kernel runs one token (or one
// permuted row) whole on one thread, so the results do not depend on the thread count.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

struct RouterSpec {
  std::int64_t E = 0, k = 0;  // experts, experts per token
  bool sigmoid = false;       // score function: softmax or sigmoid
  bool pre_softmax = false;   // softmax over all E before the top-k (softmax only)
};

// Forward routing of R tokens. idx (R k) the chosen experts, best first; probs (R k) their
// weights:
//   softmax            top-k of the logits, probs = softmax over the k chosen logits
//   softmax, pre       s = softmax(logits); top-k of s, probs = the chosen s
//   sigmoid            s = sigmoid(logits); top-k of s, probs = s / (sum of the chosen s + 1e-20)
//                      for k > 1, s for k = 1
// With an expert bias (E; sigmoid only; empty view: none) the top-k is that of s + bias, the
// probabilities still the chosen s normalised (the bias only selects; aux-loss-free balancing).
// lse (R): log-sum-exp of each token's logits (the z-loss); ssum (R): under sigmoid the sum of
// the token's E sigmoids + 1e-20 (the load-balancing scores' normaliser; 1 under softmax);
// paux (E): sum over the R tokens of the load-balancing scores p (softmax(logits), or
// sigmoid(logits) / ssum), added in token order (host; on a device in parts, device_parallel).
void moe_route(const IntView& idx, const FloatView& probs, const FloatView& lse, const FloatView& ssum,
               const FloatView& paux, const FloatView& logits, std::int64_t R, const RouterSpec& r,
               const FloatView& bias = FloatView());

// Backward routing: dlogits (R, E) (overwritten) = d/d logits of
//   sum_tj dprobs[t, j] probs[t, j]  +  sum_te aux_grad[e] p_te  +  z_grad sum_t lse_t^2
// given the forward's logits, lse, idx and probs (aux_grad (E): the load-balancing loss's
// derivative with respect to p_te, the same for every token; z_grad a scalar).
void moe_route_backward(const FloatView& dlogits, const FloatView& dprobs, const FloatView& logits,
                        const FloatView& lse, const FloatView& ssum, const IntView& idx, const FloatView& probs,
                        const FloatView& aux_grad, float z_grad, std::int64_t R, const RouterSpec& r);

// The dispatch of one micro-batch's selections (host side; moe_plan).
struct MoePlan {
  std::int64_t R = 0, k = 0, E = 0;
  std::vector<std::int64_t> routed;   // (E) selections per expert before capacity drops
  std::vector<std::int64_t> counts;   // (E) rows per expert after them
  std::vector<std::int64_t> offsets;  // (E + 1) first permuted row of each expert
  std::int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  std::int64_t dropped() const { return R * k - rows(); }
  std::vector<std::int32_t> row_token;  // (rows) token of each permuted row
  std::vector<std::int32_t> slot_row;   // (R k) permuted row of selection (t, j); -1 dropped
};

// The plan of R tokens' selections idx (R k, host) with probabilities probs (R k, host): dropless
// when capacity <= 0; else each expert keeps `capacity` of its selections, those of the largest
// probabilities (by_probs) or its first tokens (otherwise).
MoePlan moe_plan(const std::int32_t* idx, const float* probs, std::int64_t R, std::int64_t k, std::int64_t E,
                 std::int64_t capacity, bool by_probs);
// Megatron's capacity: ceil(tokens k / E x factor).
std::int64_t moe_capacity(std::int64_t tokens, std::int64_t k, std::int64_t E, double factor);

// The expert-parallel exchange of one micro-batch's dispatch (host side), between the ep ranks of
// an expert-parallel group, each holding El = E / ep experts (rank r: experts r El .. r El + El - 1).
// A rank's permuted rows are grouped by expert, so the rows for rank r are contiguous; it receives
// the rows for its own experts grouped by source rank, then by local expert, and regroups them
// by local expert, then by source rank, before the experts run (Megatron's all-to-all dispatcher).
struct MoeExchange {
  std::int64_t ep = 1, El = 0;
  std::vector<std::int64_t> send_rows, recv_rows;  // (ep) rows to / from each rank of the group
  // the expert side: rows per local expert and their offsets in (local expert, source) order
  std::vector<std::int64_t> counts, offsets;  // (El), (El + 1)
  // (rows()) expert-side row m is received row regroup[m]; received row q is expert-side row inverse[q]
  std::vector<std::int32_t> regroup, inverse;
  std::int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
};
// sent (ep El): this rank's rows for each global expert (its plan's counts); received (ep El):
// received[r El + j] rows from rank r for local expert j (the all-to-all of `sent`).
MoeExchange moe_exchange(const std::vector<std::int64_t>& sent, const std::vector<std::int64_t>& received,
                         std::int64_t ep);

// xp (N, C) = x[row_token[n]] for n < N (x (R, C); one storage type).
void moe_gather(const Act& xp, const Act& x, const IntView& row_token, std::int64_t N, std::int64_t C);
// out (R, C) fp32 (overwritten) = sum_j probs[t, j] yp[slot_row[t, j]] over kept selections, in j order.
void moe_combine(const FloatView& out, const FloatView& yp, const FloatView& probs, const IntView& slot_row,
                 std::int64_t R, std::int64_t k, std::int64_t C);
// Its backward: dyp[row(t, j)] = probs[t, j] dout[t]; dprobs[t, j] = dout[t] . yp[row(t, j)] (0 dropped).
void moe_combine_backward(const FloatView& dyp, const FloatView& dprobs, const FloatView& dout, const FloatView& yp,
                          const FloatView& probs, const IntView& slot_row, std::int64_t R, std::int64_t k,
                          std::int64_t C);
// dx (R, C) fp32 (overwritten) = sum_j dxp[slot_row[t, j]] over kept selections, in j order (the
// gather's backward).
void moe_scatter_add(const FloatView& dx, const FloatView& dxp, const IntView& slot_row, std::int64_t R, std::int64_t k,
                     std::int64_t C);

// y (rows, C) fp32 += bias (C) (fp32 or 16-bit words): an expert's fc2 bias on its rows.
void moe_add_bias(const FloatView& y, const Act& bias, std::int64_t rows, std::int64_t C);

}  // namespace trident
