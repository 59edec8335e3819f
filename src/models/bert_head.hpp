// BERT's output heads on the encoder's final LayerNorm output x (BT, C), all rows on every
// tensor-parallel rank (gathered from the row split first under sequence parallelism):
//   masked LM:   h = LayerNorm(gelu(x W_d^T + b_d)); logits = h wte^T + b (vocabulary-parallel:
//                this rank's columns of the tied word embeddings and of the bias); cross-entropy
//                at the positions with a label; loss = mean over those positions
//   sentence order (binary head): p = tanh(x[b, 0] W_p^T + b_p) on the [CLS] position;
//                logits2 = p W_b^T + b_b; loss = mean cross-entropy over the micro-batch
// The dense, LayerNorm, pooler and binary-head parameters are replicated over TP; the LM bias is
// split like the vocabulary. Without sequence parallelism the gradient at h is all-reduced over
// TP (its vocabulary parts summed), so dx and every replicated gradient are complete and equal
// on all TP ranks. With sequence parallelism the gradients stay partial instead: dx is summed
// by the reduce-scatter back to the row split and the replicated parameters' gradients by the
// trainer's TP all-reduce of the replicated range, so the sentence-order gradient (the same on
// every TP rank) is contributed by TP rank 0 alone.
// Checkpoint names: model/lm_head/dense/{weight,bias}, model/lm_head/layernorm/{weight,bias},
// model/lm_head/bias [vocab_size], model/pooler/dense/{weight,bias},
// model/binary_head/{weight,bias} [2, C], [2]. Mixed precision as GPT's head: 16-bit
// parameters and GEMM inputs (x, the LayerNorm output h, the pooled [CLS] rows, the tanh
// output), fp32 GEMM outputs, GELU, LayerNorm statistics, softmax, cross-entropy and gradients.
// The losses are the micro-batch's means (LossParts lm = masked LM, sop = sentence order), and
// the head returns lm + sop.
#pragma once
#include "layers/layer_norm.hpp"
#include "layers/linear.hpp"
#include "layers/tensor_parallel.hpp"
#include "models/model_head.hpp"

namespace trident {

class BertHead : public ModelHead {
 public:
  // wte: this stage's word embeddings (tied); vocab_local rows of the padded vocabulary from
  // vocab_start; B, T: micro-batch and sequence length.
  BertHead(ParamStore& store, ParamId wte, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab_size,
           std::int64_t vocab_local, std::int64_t vocab_start, float init_std, float ln_eps, bool binary_head,
           const TensorParallel& tp, DType dt);

  // mlm + sop of the micro-batch; when training, dx (BT, C) receives the gradient of
  // dscale * (mlm + sop) and the parameter gradients (wte's included) accumulate.
  double run(const Act& x, const MicroBatch& mb, bool training, float dscale, std::int64_t samples,
             const FloatView& dx) override;
  LossParts take_loss_parts() override;
  bool grad_in_norm_buffer() const override { return !partial_; }
  std::int64_t workspace_bytes() const override;

 private:
  LossParts losses(const Act& x, const Act& wte, const FloatView& dwte, const MicroBatch& mb, bool training,
                   float dscale, const FloatView& dx);
  ParamId wte_ = -1;
  LossParts parts_;
  std::int64_t B_ = 0, T_ = 0, C_ = 0, V_ = 0, Vl_ = 0, start_ = 0;
  bool binary_ = true, partial_ = false;
  TensorParallel tp_;
  ParamStore* store_ = nullptr;
  Linear dense_, pooler_, binary_head_;
  LayerNorm norm_;
  ParamId bias_ = -1;
  DType dt_ = DType::F32;
  FloatView t1_, t2_, mean_, rstd_, logits_, losses_, dt3_, dt2_, dt1_, ce_scratch_;
  Act t3_;  // the LM head's LayerNorm output (BT, C), a GEMM input
  FloatView p1_, p2_, logits2_, losses2_, dp2_, dp1_, dpin_;
  Act pin_, p2in_;  // pooled [CLS] rows and the tanh output as GEMM inputs (B, C)
  HalfView dy16_;   // 16-bit copies of gradients entering GEMMs (BT * max(C, Vl))
};

}  // namespace trident
