// BertHead (bert_head.hpp; docs/DESIGN.md "The model core"): the dense, LayerNorm,
// vocabulary-parallel bias, pooler and binary-head parameters under their checkpoint names, and
// the workspaces. losses() runs the masked-LM transform, the tied logits and the (vocabulary-
// parallel) cross-entropy scaled by dscale / labelled positions, then the sentence-order head on
// the [CLS] rows; when training, the backward passes: the logits' gradient (16-bit in mixed
// precision) into dwte and the bias, the transform's into dx, the pooler's added to the [CLS]
// rows of dx.
#include "models/bert_head.hpp"

#include <algorithm>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/elementwise.hpp"
#include "ops/gelu.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

BertHead::BertHead(ParamStore& store, ParamId wte, std::int64_t B, std::int64_t T, std::int64_t C,
                   std::int64_t vocab_size, std::int64_t vocab_local, std::int64_t vocab_start, float init_std,
                   float ln_eps, bool binary_head, const TensorParallel& tp, DType dt)
    : wte_(wte), B_(B), T_(T), C_(C), V_(vocab_size), Vl_(vocab_local), start_(vocab_start), binary_(binary_head),
      partial_(tp.sequence_parallel), tp_(tp), store_(&store), dt_(dt) {
  dense_ = Linear(store, "model/lm_head/dense", C, C, init_std);
  norm_ = LayerNorm(store, "model/lm_head/layernorm", C, ln_eps);
  bias_ = declare_lm_head_bias(store, V_, Vl_, start_);
  if (binary_) {
    pooler_ = Linear(store, "model/pooler/dense", C, C, init_std);
    binary_head_ = Linear(store, "model/binary_head", C, 2, init_std);
  }
  const std::int64_t BT = B * T;
  for (FloatView* v : {&t1_, &t2_, &dt3_, &dt2_, &dt1_}) *v = make_float("bert_head::act", BT * C);
  t3_ = make_act(dt, "bert_head::t3", BT * C);
  if (dt != DType::F32) dy16_ = make_half("bert_head::dy16", BT * std::max(C, Vl_));
  mean_ = make_float("bert_head::mean", BT);
  rstd_ = make_float("bert_head::rstd", BT);
  logits_ = make_float("bert_head::logits", BT * Vl_);
  losses_ = make_float("bert_head::losses", BT);
  ce_scratch_ = make_float("bert_head::ce_scratch", 3 * BT);
  if (binary_) {
    for (FloatView* v : {&p1_, &p2_, &dp2_, &dp1_, &dpin_}) *v = make_float("bert_head::pooler", B * C);
    pin_ = make_act(dt, "bert_head::pin", B * C);
    p2in_ = dt == DType::F32 ? act(p2_) : make_act(dt, "bert_head::p2in", B * C);
    logits2_ = make_float("bert_head::logits2", B * 2);
    losses2_ = make_float("bert_head::losses2", B);
  }
}

std::int64_t BertHead::workspace_bytes() const {
  std::int64_t n = 0;
  for (const FloatView* v : {&t1_, &t2_, &mean_, &rstd_, &logits_, &losses_, &dt3_, &dt2_, &dt1_, &ce_scratch_, &p1_,
                             &p2_, &logits2_, &losses2_, &dp2_, &dp1_, &dpin_})
    n += static_cast<std::int64_t>(v->span()) * 4;
  n += t3_.bytes() + pin_.bytes() + static_cast<std::int64_t>(dy16_.span()) * 2;
  if (dt_ != DType::F32) n += p2in_.bytes();
  return n;
}

LossParts BertHead::take_loss_parts() {
  const LossParts p = parts_;
  parts_ = {};
  return p;
}

double BertHead::run(const Act& x, const MicroBatch& mb, bool training, float dscale, std::int64_t,
                     const FloatView& dx) {
  const LossParts l = losses(x, store_->param(wte_), store_->grad(wte_), mb, training, dscale, dx);
  parts_.add(l);
  return l.lm + l.sop;
}

LossParts BertHead::losses(const Act& x, const Act& wte, const FloatView& dwte, const MicroBatch& mb, bool training,
                           float dscale, const FloatView& dx) {
  const bool half = dt_ != DType::F32;
  const std::int64_t BT = B_ * T_, C = C_;
  const double n_targets = static_cast<double>(std::max<std::int64_t>(mb.num_targets, 1));
  LossParts out;
  // ---- masked LM ----
  dense_.forward(t1_, x, BT);
  TRIDENT_DEVICE_WAIT();
  gelu_forward(t2_, t1_, BT * C);
  TRIDENT_DEVICE_WAIT();
  norm_.forward(t3_, mean_, rstd_, t2_, BT);
  TRIDENT_DEVICE_WAIT();
  // logits (BT, Vl) = t3 wte_local^T + bias_local
  gemm_mixed(Trans::N, Trans::T, BT, Vl_, C, 1.f, operand(t3_), C, operand(wte), C, 0.f, logits_.data(), Vl_);
  add_bias(logits_, store_->param(bias_), BT, Vl_);
  TRIDENT_DEVICE_WAIT();
  const float dmlm = static_cast<float>(dscale / n_targets);
  token_cross_entropy(losses_, logits_, mb.targets, BT, V_, Vl_, start_, dmlm, training, tp_.comm, ce_scratch_);
  TRIDENT_DEVICE_WAIT();
  out.lm_sum = sum_losses(losses_, BT);
  out.lm_count = static_cast<double>(mb.num_targets);
  out.lm = out.lm_sum / n_targets;
  // ---- sentence order ----
  if (binary_) {
    gather_strided_rows(pin_, x, B_, T_, C);  // the [CLS] rows
    TRIDENT_DEVICE_WAIT();
    pooler_.forward(p1_, pin_, B_);
    TRIDENT_DEVICE_WAIT();
    tanh_forward(p2_, p1_, B_ * C);
    TRIDENT_DEVICE_WAIT();
    if (half) {
      pack_half(dt_, p2in_.h, p2_, B_ * C);
      TRIDENT_DEVICE_WAIT();
    }
    binary_head_.forward(logits2_, p2in_, B_);
    TRIDENT_DEVICE_WAIT();
    const double n_sent = static_cast<double>(std::max<std::int64_t>(mb.num_sentences, 1));
    const float dsop = static_cast<float>(dscale / n_sent);
    if (training)
      cross_entropy_forward_backward(losses2_, logits2_, mb.sentence_order, B_, 2, 2, dsop);
    else
      cross_entropy_forward(losses2_, logits2_, mb.sentence_order, B_, 2, 2);
    TRIDENT_DEVICE_WAIT();
    out.sop_sum = sum_losses(losses2_, B_);
    out.sop_count = static_cast<double>(mb.num_sentences);
    out.sop = out.sop_sum / n_sent;
  }
  if (!training) return out;

  // ---- backward: logits -> h (partial over TP: this rank's vocabulary columns) ----
  GemmOperand dlogits = operand(logits_.data());  // (BT, Vl): fp32, or its 16-bit copy
  if (half) {                                     // the logits' gradient enters the GEMMs in 16 bits
    pack_half(dt_, dy16_, logits_, BT * Vl_);
    TRIDENT_DEVICE_WAIT();
    dlogits = operand(dt_, dy16_.data());
  }
  gemm_mixed(Trans::N, Trans::N, BT, C, Vl_, 1.f, dlogits, Vl_, operand(wte), C, 0.f, dt3_.data(), C);
  gemm_mixed(Trans::T, Trans::N, Vl_, C, BT, 1.f, dlogits, Vl_, operand(t3_), C, 1.f, dwte.data(), C);
  bias_backward(store_->grad(bias_), logits_, BT, Vl_);
  TRIDENT_DEVICE_WAIT();
  if (!partial_) CopyToTensorParallelRegion::backward(tp_, dt3_, BT * C);
  Kokkos::deep_copy(dt2_, 0.f);
  norm_.backward(dt2_, dt3_, t2_, mean_, rstd_, BT);
  TRIDENT_DEVICE_WAIT();
  gelu_backward(dt1_, dt2_, t1_, BT * C);
  TRIDENT_DEVICE_WAIT();
  dense_.backward(dx, dt1_, x, BT, dy16_);  // overwrites dx
  TRIDENT_DEVICE_WAIT();
  if (binary_ && (!partial_ || tp_.rank() == 0)) {
    binary_head_.backward(dp2_, logits2_, p2in_, B_, dy16_);
    TRIDENT_DEVICE_WAIT();
    tanh_backward(dp1_, dp2_, p2_, B_ * C);
    TRIDENT_DEVICE_WAIT();
    pooler_.backward(dpin_, dp1_, pin_, B_, dy16_);
    TRIDENT_DEVICE_WAIT();
    scatter_add_strided_rows(dx, dpin_, B_, T_, C);
    TRIDENT_DEVICE_WAIT();
  }
  return out;
}

}  // namespace trident
