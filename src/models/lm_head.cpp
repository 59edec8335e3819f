// The tied LM head and vocabulary-parallel cross-entropy of GPT and T5 (lm_head.hpp).
#include "models/lm_head.hpp"

#include <algorithm>

#include "common/device_parallel.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_lt.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

ParamId declare_lm_head_bias(ParamStore& store, std::int64_t V, std::int64_t Vl, std::int64_t start) {
  ParamInfo b;
  b.name = "model/lm_head/bias";
  b.shape = {Vl};
  b.global_shape = {V};
  b.global_offset = {std::min(start, V)};
  b.valid = {std::max<std::int64_t>(0, std::min(Vl, V - start))};
  b.tp_replicated = false;
  return store.declare(b);
}

LmHead::LmHead(ParamStore& store, ParamId wte, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab_size,
               std::int64_t vocab_local, std::int64_t vocab_start, const TensorParallel& tp, DType dt, bool with_bias,
               bool per_target_mean)
    : store_(&store), wte_(wte), B_(B), T_(T), C_(C), V_(vocab_size), Vl_(vocab_local), start_(vocab_start), tp_(tp),
      per_target_mean_(per_target_mean) {
  if (with_bias) bias_ = declare_lm_head_bias(store, V_, Vl_, start_);
  const std::int64_t BT = B * T;
  half_logits_ = kDeviceKernels && dt != DType::F32 && !with_bias;
  if (dt != DType::F32) dlogits16_ = make_half("lm_head::dlogits16", BT * Vl_);
  if (!half_logits_) logits_ = make_float("lm_head::logits", BT * Vl_);
  losses_ = make_float("lm_head::losses", BT);
  loss_sum_ = View1<double>("lm_head::loss_sum", 2);
  ce_scratch_ = make_float("lm_head::ce_scratch", 3 * BT);
}

std::int64_t LmHead::workspace_bytes() const {
  return static_cast<std::int64_t>(logits_.span() + losses_.span() + ce_scratch_.span()) * 4 +
         static_cast<std::int64_t>(dlogits16_.span()) * 2;
}

double LmHead::take_device_loss() {
  if (!(kDeviceKernels && !per_target_mean_)) return 0.0;
  return take_loss_sum(loss_sum_);
}

LossParts LmHead::take_loss_parts() {
  const LossParts p = parts_;
  parts_ = {};
  return p;
}

double LmHead::run(const Act& x, const MicroBatch& mb, bool training, float dscale, std::int64_t samples,
                   const FloatView& dx) {
  const std::int64_t C = C_, T = T_, BT = B_ * T_, Vl = Vl_;
  const Act wte = store_->param(wte_);
  // logits (BT, Vl): fp32 (16-bit inputs, fp32 accumulation) for the fp32 cross-entropy, or, on the
  // device path with 16-bit parameters, rounded to 16 bits by the GEMM for the 16-bit classifier
  if (half_logits_) {
    gemm_lt(lt_call(Trans::N, Trans::T, BT, Vl, C, operand(x), C, operand(wte), C, wte.dt, dlogits16_.data(), Vl));
  } else {
    gemm_mixed(Trans::N, Trans::T, BT, Vl, C, 1.f, operand(x), C, operand(wte), C, 0.f, logits_.data(), Vl);
    if (bias_ >= 0) add_bias(logits_, store_->param(bias_), BT, Vl);  // this rank's vocabulary columns
  }
  const double per_target = per_target_mean_ ? 1.0 / static_cast<double>(std::max<std::int64_t>(mb.num_targets, 1))
                                             : 1.0;
  if (per_target_mean_) dscale = static_cast<float>(dscale * per_target);
  const std::int64_t count = training ? BT : samples * T;
  if (half_logits_)
    token_cross_entropy_half(wte.dt, losses_, dlogits16_, mb.targets, BT, V_, Vl, start_, dscale, training, tp_.comm,
                             ce_scratch_);
  else
    token_cross_entropy(losses_, logits_, mb.targets, BT, V_, Vl, start_, dscale, training, tp_.comm, ce_scratch_);
  const bool on_device = kDeviceKernels && training && !per_target_mean_;
  double loss_sum = on_device ? 0.0 : sum_losses(losses_, count);
  if (on_device) add_losses(loss_sum_, losses_, count);
  if (per_target_mean_) {
    parts_.add(LossParts{loss_sum * per_target, 0.0, loss_sum, static_cast<double>(mb.num_targets), 0.0, 0.0});
    loss_sum *= per_target;
  }
  if (!training) return loss_sum;
  const FloatView dwte = store_->grad(wte_);
  const bool trains = store_->trains(wte_);  // frozen under LoRA: no weight gradient
  if (bias_ >= 0 && trains) bias_backward(store_->grad(bias_), logits_, BT, Vl);  // logits_ holds d logits
  GemmOperand dlogits = operand(logits_.data());
  if (half_logits_) {  // the gradient is in place of the 16-bit logits
    dlogits = operand(wte.dt, dlogits16_.data());
  } else if (wte.is_half()) {  // the logits' gradient enters the GEMMs in 16 bits
    pack_half(wte.dt, dlogits16_, logits_, BT * Vl);
    dlogits = operand(wte.dt, dlogits16_.data());
  }
  // dx (BT, C) = dlogits (BT, Vl) wte_local (Vl, C): partial over TP
  gemm_mixed(Trans::N, Trans::N, BT, C, Vl, 1.f, dlogits, Vl, operand(wte), C, 0.f, dx.data(), C);
  // dwte_local += dlogits^T x
  if (trains) gemm_mixed(Trans::T, Trans::N, Vl, C, BT, 1.f, dlogits, Vl, operand(x), C, 1.f, dwte.data(), C);
  // without sequence parallelism the input came in by copy_to: its gradient is summed over TP
  if (!tp_.sequence_parallel) CopyToTensorParallelRegion::backward(tp_, dx, BT * C);
  return loss_sum;
}

}  // namespace trident
