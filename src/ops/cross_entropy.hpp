// Softmax cross-entropy over (possibly padded) vocabulary logits, in fp32. Columns >= V are
// padding: they are masked out, so neither the loss nor any gradient depends on the padding.
// A negative target marks a position without a loss (BERT's unmasked tokens, label -1): its
// loss is 0 and its row of the gradient is 0.
#pragma once
#include "comm/communicator.hpp"
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// losses (N) = -log softmax(logits[n, :V])[target[n]]
void cross_entropy_forward(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                           std::int64_t V, std::int64_t Vp);
// As forward, and overwrites logits with d(sum_n losses[n] * dscale)/dlogits (padding columns 0).
void cross_entropy_forward_backward(const FloatView& losses, const FloatView& logits, const IntView& targets,
                                    std::int64_t N, std::int64_t V, std::int64_t Vp, float dscale);
// Vocabulary-parallel form: logits (N, Vl) hold columns [start, start + Vl) of the padded
// vocabulary on this rank; columns >= V are padding. The row max, the sum of exponentials and
// the target logit are combined over the TP group (comm), so the full logits never meet on
// one rank. With backward, logits are overwritten with the gradient of dscale * sum(losses).
// scratch: at least 3 * N floats.
void vocab_parallel_cross_entropy(const FloatView& losses, const FloatView& logits, const IntView& targets,
                                  std::int64_t N, std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale,
                                  bool backward, const Communicator& comm, const FloatView& scratch);
// The loss of logits (N, Vl) for a tensor-parallel group `comm` (nullptr or one rank: the local
// forms above, with Vl = Vp; else the vocabulary-parallel form): what the LM heads call.
// backward: also the gradient, as cross_entropy_forward_backward.
void token_cross_entropy(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                         std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale, bool backward,
                         const Communicator* comm, const FloatView& scratch);
// The device path's 16-bit classifier (docs/DESIGN.md "Kernels on a GPU"): token_cross_entropy over
// logits held as 16-bit words of type dt (the LM head's GEMM writes them so), each loaded to fp32
// for the max, the sum of exponentials and the loss; with backward, the gradient rounded to dt
// replaces them in place (what the head's backward GEMMs read). Device kernels only (a host build
// without TRIDENT_DEVICE_KERNELS_ON_HOST throws).
void token_cross_entropy_half(DType dt, const FloatView& losses, const HalfView& logits, const IntView& targets,
                              std::int64_t N, std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale,
                              bool backward, const Communicator* comm, const FloatView& scratch);
// sum over n of losses[n], accumulated in double
double sum_losses(const FloatView& losses, std::int64_t N);
// The same sum kept on the device (no wait): sums (2) holds the running total in sums(0) and the
// micro-batch's sum in sums(1); sums(0) += the sum of losses[0, N), the additions of sum_losses
// then of a host total. take_loss_sum reads sums(0) (one wait) and resets it to 0.
void add_losses(const View1<double>& sums, const FloatView& losses, std::int64_t N);
double take_loss_sum(const View1<double>& sums);

}  // namespace trident
