// The language-model head of GPT and T5: logits = x wte^T (+ bias for T5) against this rank's
// rows of the tied, vocabulary-parallel word embeddings, then the vocabulary-parallel
// cross-entropy, so the full logits never meet on one rank. Padded vocabulary columns are
// masked, so neither losses nor gradients depend on the padding or on tp.
//   GPT: the loss is the SUM of the token losses (of the first `samples` samples when scoring).
//   T5 (per_target_mean): the mean over the micro-batch's targets (mb.num_targets, padding
//        excluded), recorded as the `lm` loss part; the head adds a vocabulary-parallel bias
//        model/lm_head/bias [vocab_size].
// Mixed precision: 16-bit x and word embeddings enter the logits GEMM, whose output, the
// softmax, the cross-entropy and its gradient are fp32; the logits' gradient is rounded to 16
// bits before the two backward GEMMs.
#pragma once
#include "layers/param_store.hpp"
#include "layers/tensor_parallel.hpp"
#include "models/model_head.hpp"

namespace trident {

class LmHead : public ModelHead {
 public:
  // B, T: micro-batch and the head's sequence length (T5: the decoder's); wte: the word
  // embeddings (this stage's copy); vocab_local rows of the padded vocabulary from vocab_start.
  LmHead(ParamStore& store, ParamId wte, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab_size,
         std::int64_t vocab_local, std::int64_t vocab_start, const TensorParallel& tp, DType dt, bool with_bias,
         bool per_target_mean);
  double run(const Act& x, const MicroBatch& mb, bool training, float dscale, std::int64_t samples,
             const FloatView& dx) override;
  LossParts take_loss_parts() override;
  // With the kernels' device layouts and a plain token mean (pretraining), run() adds each
  // training micro-batch's loss into a device sum instead of reading it, and this reads the sum.
  double take_device_loss() override;
  std::int64_t workspace_bytes() const override;

 private:
  ParamStore* store_;
  ParamId wte_, bias_ = -1;
  std::int64_t B_, T_, C_, V_, Vl_, start_;
  TensorParallel tp_;
  bool per_target_mean_;
  LossParts parts_;
  // The 16-bit classifier of the device path (16-bit parameters, no bias): the logits written in 16
  // bits by their GEMM into dlogits16_ and their gradient rounded over them (ops/cross_entropy's
  // token_cross_entropy_half); no fp32 logits
  bool half_logits_ = false;
  FloatView logits_;        // (BT, Vl) this rank's vocabulary columns; their gradient after backward
  FloatView losses_;        // (BT) token losses
  View1<double> loss_sum_;  // (2) the device-side sum of the training losses, and one micro-batch's
  FloatView ce_scratch_;    // (3 BT) vocabulary-parallel cross-entropy reductions
  HalfView dlogits16_;      // (BT, Vl) 16-bit copy of the logits' gradient for the backward GEMMs (or, with
                            // half_logits_, the 16-bit logits and then their gradient)
};

}  // namespace trident
