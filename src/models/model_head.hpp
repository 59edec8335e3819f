// The interface between the shared transformer stack (models/language_model) and a family's
// output head: the stack runs its final LayerNorm and hands the head every row of the last
// stage's output; the head computes the loss and, when training, the gradient at its input.
// Implementations: LmHead (GPT, T5: the tied LM head and vocabulary-parallel cross-entropy) and
// BertHead (masked LM and sentence order).
#pragma once
#include <cstdint>

#include "common/types.hpp"
#include "layers/param_store.hpp"
#include "models/loss_parts.hpp"
#include "models/micro_batch.hpp"

namespace trident {

class ModelHead {
 public:
  virtual ~ModelHead() = default;
  // x: (BT, C) the final LayerNorm output of every row of the micro-batch (gathered from the row
  // split under sequence parallelism). Returns the loss the model reports for the micro-batch
  // (of its first `samples` samples when not training, for heads that count samples). When
  // training, dx (BT, C) receives the gradient of dscale x that loss -- complete on every
  // tensor-parallel rank without sequence parallelism, partial sums over TP with it -- and the
  // head's parameter gradients accumulate.
  virtual double run(const Act& x, const MicroBatch& mb, bool training, float dscale, std::int64_t samples,
                     const FloatView& dx) = 0;
  // The loss parts summed since the last call; resets them.
  virtual LossParts take_loss_parts() { return {}; }
  // The training losses kept on the device since the last call (a head that sums them there
  // returns 0 from run() when training); resets the sum. One read of the device.
  virtual double take_device_loss() { return 0.0; }
  // True when dx may be the final LayerNorm's own gradient buffer (the head writes it whole,
  // complete over TP, without sequence parallelism): saves one (BT, C) buffer.
  virtual bool grad_in_norm_buffer() const { return false; }
  virtual std::int64_t workspace_bytes() const = 0;
};

// "model/lm_head/bias" (V), vocabulary-parallel like the word embeddings: this rank holds
// entries [start, start + Vl) of the padded vocabulary, those below V real (GPT has none; T5's
// LM head and BERT's masked-LM head declare it).
ParamId declare_lm_head_bias(ParamStore& store, std::int64_t V, std::int64_t Vl, std::int64_t start);

}  // namespace trident
