// GPT-2 assembly: embeddings -> layers -> final LayerNorm -> tied LM head -> cross-entropy.
#include "models/gpt_model.hpp"

#include <cmath>
#include <string>

#include "common/error.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"

namespace trident {

GptModel::GptModel(const GptConfig& cfg, ParamStore& store, std::int64_t micro_batch)
    : cfg_(cfg), store_(&store), B_(micro_batch) {
  const std::int64_t C = cfg.hidden, T = cfg.seq_length, BT = B_ * T;
  TRIDENT_REQUIRE(cfg.heads > 0 && C % cfg.heads == 0,
                  "model.hidden_size (" << C << ") must be divisible by model.num_heads (" << cfg.heads << ")");
  TRIDENT_REQUIRE(T <= cfg.max_positions, "model.seq_length (" << T << ") exceeds model.max_position_embeddings ("
                                                                << cfg.max_positions << ")");
  TRIDENT_REQUIRE(cfg.padded_vocab >= cfg.vocab_size, "padded vocabulary smaller than vocabulary");

  ParamInfo wte;
  wte.name = "model/embedding/word_embeddings";
  wte.shape = {cfg.padded_vocab, C};
  wte.global_shape = {cfg.vocab_size, C};
  wte.global_offset = {0, 0};
  wte.valid = {cfg.vocab_size, C};
  wte.weight_decay = true;
  wte.init_std = cfg.init_std;
  wte_ = store.declare(wte);
  wpe_ = store.declare("model/embedding/position_embeddings", {cfg.max_positions, C}, true, cfg.init_std);

  TransformerShape ts{B_, T, C, cfg.heads, cfg.ffn, cfg.ln_eps, cfg.init_std,
                      cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.num_layers)), true};
  for (std::int64_t l = 0; l < cfg.num_layers; ++l)
    layers_.push_back(std::make_unique<TransformerLayer>(store, "model/layers/" + std::to_string(l), ts));
  lnf_ = LayerNorm(store, "model/final_layernorm", C, cfg.ln_eps);
  scratch_ = std::make_unique<TransformerScratch>(ts);

  encoded_ = make_float("gpt::encoded", BT * C);
  lnf_out_ = make_float("gpt::lnf_out", BT * C);
  lnf_mean_ = make_float("gpt::lnf_mean", BT);
  lnf_rstd_ = make_float("gpt::lnf_rstd", BT);
  logits_ = make_float("gpt::logits", BT * cfg.padded_vocab);
  losses_ = make_float("gpt::losses", BT);
  dres_ = make_float("gpt::dres", BT * C);
  dlnf_ = make_float("gpt::dlnf", BT * C);
}

double GptModel::forward(const IntView& tokens, const IntView& targets, std::int64_t samples) {
  return run_forward(tokens, targets, false, 0.f, samples < 0 ? B_ : samples);
}

double GptModel::forward_backward(const IntView& tokens, const IntView& targets, float dscale) {
  return run_forward(tokens, targets, true, dscale, B_);
}

double GptModel::run_forward(const IntView& tokens, const IntView& targets, bool backward, float dscale,
                             std::int64_t samples) {
  const std::int64_t C = cfg_.hidden, T = cfg_.seq_length, BT = B_ * T, Vp = cfg_.padded_vocab;
  const FloatView wte = store_->value(wte_);
  embedding_forward(encoded_, tokens, wte, store_->value(wpe_), B_, T, C);
  Kokkos::fence();
  const FloatView* x = &encoded_;
  for (auto& layer : layers_) {
    layer->forward(*x);
    x = &layer->out();
  }
  lnf_.forward(lnf_out_, lnf_mean_, lnf_rstd_, *x, BT);
  Kokkos::fence();
  // logits (BT, Vp) = lnf_out (BT, C) wte^T (C, Vp)
  gemm(Trans::N, Trans::T, BT, Vp, C, 1.f, lnf_out_.data(), C, wte.data(), C, 0.f, logits_.data(), Vp);
  if (!backward) {
    cross_entropy_forward(losses_, logits_, targets, BT, cfg_.vocab_size, Vp);
    Kokkos::fence();
    return sum_losses(losses_, samples * T);
  }
  cross_entropy_forward_backward(losses_, logits_, targets, BT, cfg_.vocab_size, Vp, dscale);
  Kokkos::fence();
  const double loss_sum = sum_losses(losses_, BT);
  const FloatView dwte = store_->grad(wte_);
  // dlnf (BT, C) = dlogits (BT, Vp) wte (Vp, C);  dwte (Vp, C) += dlogits^T lnf_out
  gemm(Trans::N, Trans::N, BT, C, Vp, 1.f, logits_.data(), Vp, wte.data(), C, 0.f, dlnf_.data(), C);
  gemm(Trans::T, Trans::N, Vp, C, BT, 1.f, logits_.data(), Vp, lnf_out_.data(), C, 1.f, dwte.data(), C);
  Kokkos::deep_copy(dres_, 0.f);
  const FloatView& last = layers_.empty() ? encoded_ : layers_.back()->out();
  lnf_.backward(dres_, dlnf_, last, lnf_mean_, lnf_rstd_, BT);
  Kokkos::fence();
  for (std::int64_t l = static_cast<std::int64_t>(layers_.size()) - 1; l >= 0; --l) {
    const FloatView& in = l == 0 ? encoded_ : layers_[l - 1]->out();
    layers_[l]->backward(dres_, in, *scratch_);
  }
  embedding_backward(dwte, store_->grad(wpe_), dres_, tokens, B_, T, C);
  Kokkos::fence();
  return loss_sum;
}

double GptModel::flops_per_step(std::int64_t tokens_batch) const {
  const double s = static_cast<double>(cfg_.seq_length), h = static_cast<double>(cfg_.hidden),
               l = static_cast<double>(cfg_.num_layers), V = static_cast<double>(cfg_.padded_vocab);
  const double B = static_cast<double>(tokens_batch) / s;
  return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * l));
}

}  // namespace trident
