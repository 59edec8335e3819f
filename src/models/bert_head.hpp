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
#pragma once
#include "layers/layer_norm.hpp"
#include "layers/linear.hpp"
#include "layers/tensor_parallel.hpp"
#include "models/micro_batch.hpp"

namespace trident {

struct BertLosses {
  double mlm = 0, sop = 0;  // means over the micro-batch
  // the sums and counts behind them (labelled positions; samples with a sentence-order label)
  double mlm_sum = 0, mlm_count = 0, sop_sum = 0, sop_count = 0;
  void add(const BertLosses& o) {
    mlm += o.mlm;
    sop += o.sop;
    mlm_sum += o.mlm_sum;
    mlm_count += o.mlm_count;
    sop_sum += o.sop_sum;
    sop_count += o.sop_count;
  }
};

class BertHead {
 public:
  BertHead() = default;
  BertHead(ParamStore& store, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab_size,
           std::int64_t vocab_local, std::int64_t vocab_start, float init_std, float ln_eps, bool binary_head,
           const TensorParallel& tp, DType dt);

  // Losses of the micro-batch; when training, dx (BT, C) receives the gradient of
  // dscale * (mlm + sop) and the parameter gradients (wte's included, into dwte) accumulate.
  BertLosses run(const Act& x, const Act& wte, const FloatView& dwte, const MicroBatch& mb, bool training,
                 float dscale, const FloatView& dx);
  std::int64_t workspace_bytes() const;

 private:
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
