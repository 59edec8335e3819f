// GPT-2 assembly: embeddings -> layers -> final LayerNorm -> tied LM head -> cross-entropy.
#include "models/gpt_model.hpp"

#include <cmath>
#include <string>

#include "common/error.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"

namespace trident {

namespace {
constexpr std::uint64_t kEmbeddingSite = 0;
}

GptModel::GptModel(const GptConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp)
    : cfg_(cfg), store_(&store), tp_(tp), B_(micro_batch) {
  const std::int64_t C = cfg.hidden, T = cfg.seq_length, p = tp.size(), r = tp.rank();
  rows_ = B_ * T;
  local_rows_ = tp.sequence_parallel ? rows_ / p : rows_;
  TRIDENT_REQUIRE(cfg.heads > 0 && C % cfg.heads == 0,
                  "model.hidden_size (" << C << ") must be divisible by model.num_heads (" << cfg.heads << ")");
  TRIDENT_REQUIRE(cfg.heads % p == 0, "model.num_heads (" << cfg.heads << ") is not divisible by parallel.tp (" << p << ")");
  TRIDENT_REQUIRE(T <= cfg.max_positions, "model.seq_length (" << T << ") exceeds model.max_position_embeddings ("
                                                                << cfg.max_positions << ")");
  TRIDENT_REQUIRE(cfg.padded_vocab >= cfg.vocab_size && cfg.padded_vocab % p == 0,
                  "padded vocabulary " << cfg.padded_vocab << " does not split over tp = " << p);
  TRIDENT_REQUIRE(!tp.sequence_parallel || rows_ % p == 0,
                  "sequence parallelism splits micro_batch_size x seq_length = " << rows_ << " tokens over tp = " << p
                                                                                  << ": not divisible");
  vocab_local_ = cfg.padded_vocab / p;
  vocab_start_ = r * vocab_local_;

  ParamInfo wte;  // vocabulary-parallel: rows [start, start + Vl) of the padded table
  wte.name = "model/embedding/word_embeddings";
  wte.shape = {vocab_local_, C};
  wte.global_shape = {cfg.vocab_size, C};
  wte.global_offset = {std::min(vocab_start_, cfg.vocab_size), 0};
  wte.valid = {std::max<std::int64_t>(0, std::min(vocab_local_, cfg.vocab_size - vocab_start_)), C};
  wte.tp_replicated = false;
  wte.weight_decay = true;
  wte.init_std = cfg.init_std;
  wte_ = store.declare(wte);
  wpe_ = store.declare("model/embedding/position_embeddings", {cfg.max_positions, C}, true, cfg.init_std);

  TransformerShape ts{B_, T, C, cfg.heads, cfg.ffn, cfg.ln_eps, cfg.init_std,
                      cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.num_layers)), tp,
                      cfg.hidden_dropout, cfg.attention_dropout};
  for (std::int64_t l = 0; l < cfg.num_layers; ++l)
    layers_.push_back(std::make_unique<TransformerLayer>(store, "model/layers/" + std::to_string(l), l, ts));
  lnf_ = LayerNorm(store, "model/final_layernorm", C, cfg.ln_eps);
  scratch_ = std::make_unique<TransformerScratch>(ts);

  const std::int64_t R = local_rows_;
  word_ = make_float("gpt::word", rows_ * C);
  encoded_ = make_float("gpt::encoded", R * C);
  lnf_out_ = make_float("gpt::lnf_out", R * C);
  lnf_mean_ = make_float("gpt::lnf_mean", R);
  lnf_rstd_ = make_float("gpt::lnf_rstd", R);
  head_in_ = tp.sequence_parallel ? make_float("gpt::head_in", rows_ * C) : lnf_out_;
  logits_ = make_float("gpt::logits", rows_ * vocab_local_);
  losses_ = make_float("gpt::losses", rows_);
  dres_ = make_float("gpt::dres", R * C);
  dlnf_ = make_float("gpt::dlnf", R * C);
  dhead_ = make_float("gpt::dhead", rows_ * C);
  ce_scratch_ = make_float("gpt::ce_scratch", 3 * rows_);
}

double GptModel::forward(const IntView& tokens, const IntView& targets, std::int64_t samples) {
  return run(tokens, targets, false, 0.f, samples < 0 ? B_ : samples, DropoutStreams{});
}

double GptModel::forward_backward(const IntView& tokens, const IntView& targets, float dscale,
                                  const DropoutStreams& rng) {
  return run(tokens, targets, true, dscale, B_, rng);
}

DropoutSpec GptModel::embedding_dropout(const DropoutStreams& rng) const {
  DropoutSpec d;
  if (!rng.training || cfg_.hidden_dropout <= 0.f) return d;
  d.p = cfg_.hidden_dropout;
  d.key = dropout_key(tp_.sequence_parallel ? rng.tp_local : rng.shared, rng.step,
                      static_cast<std::uint64_t>(cfg_.num_layers), kEmbeddingSite);
  return d;
}

double GptModel::run(const IntView& tokens, const IntView& targets, bool backward, float dscale,
                     std::int64_t samples, const DropoutStreams& rng) {
  const std::int64_t C = cfg_.hidden, T = cfg_.seq_length, BT = rows_, R = local_rows_, Vl = vocab_local_;
  const std::int64_t p = tp_.size(), row0 = tp_.sequence_parallel ? tp_.rank() * R : 0;
  const bool sp = tp_.sequence_parallel;
  const FloatView wte = store_->value(wte_);
  // ---- vocabulary-parallel embedding: partial lookups summed over TP (reduce_from), or
  // reduce-scattered to the row split with sequence parallelism; then positions, dropout.
  embedding_lookup(word_, tokens, wte, vocab_start_, Vl, BT, C);
  Kokkos::fence();
  if (sp) {
    ReduceScatterToSequenceParallelRegion::forward(tp_, encoded_, word_, BT, C);
  } else {
    ReduceFromTensorParallelRegion::forward(tp_, word_, BT * C);
    Kokkos::deep_copy(encoded_, word_);
  }
  add_positions(encoded_, store_->value(wpe_), row0, R, T, C);
  const DropoutSpec emb_drop = backward ? embedding_dropout(rng) : DropoutSpec{};
  dropout_forward(encoded_, encoded_, R * C, emb_drop);
  Kokkos::fence();
  const FloatView* x = &encoded_;
  const DropoutStreams layer_rng = backward ? rng : DropoutStreams{};
  for (auto& layer : layers_) {
    layer->forward(*x, layer_rng);
    x = &layer->out();
  }
  lnf_.forward(lnf_out_, lnf_mean_, lnf_rstd_, *x, R);
  Kokkos::fence();
  // ---- tied LM head: the final hidden states enter the TP region (copy_to, or all-gather of
  // the row split), logits (BT, Vl) are this rank's vocabulary columns.
  if (sp) GatherFromSequenceParallelRegion::forward(tp_, head_in_, lnf_out_, R, C);
  gemm(Trans::N, Trans::T, BT, Vl, C, 1.f, head_in_.data(), C, wte.data(), C, 0.f, logits_.data(), Vl);
  const std::int64_t count = backward ? BT : samples * T;
  if (p == 1) {
    if (backward)
      cross_entropy_forward_backward(losses_, logits_, targets, BT, cfg_.vocab_size, Vl, dscale);
    else
      cross_entropy_forward(losses_, logits_, targets, BT, cfg_.vocab_size, Vl);
  } else {
    vocab_parallel_cross_entropy(losses_, logits_, targets, BT, cfg_.vocab_size, Vl, vocab_start_, dscale, backward,
                                 *tp_.comm, ce_scratch_);
  }
  Kokkos::fence();
  const double loss_sum = sum_losses(losses_, count);
  if (!backward) return loss_sum;

  const FloatView dwte = store_->grad(wte_);
  // d head input (BT, C) = dlogits (BT, Vl) wte_local (Vl, C): partial over TP
  gemm(Trans::N, Trans::N, BT, C, Vl, 1.f, logits_.data(), Vl, wte.data(), C, 0.f, dhead_.data(), C);
  // dwte_local += dlogits^T head_in
  gemm(Trans::T, Trans::N, Vl, C, BT, 1.f, logits_.data(), Vl, head_in_.data(), C, 1.f, dwte.data(), C);
  Kokkos::fence();
  if (sp) {
    GatherFromSequenceParallelRegion::backward(tp_, dlnf_, dhead_, BT, C);
  } else {
    CopyToTensorParallelRegion::backward(tp_, dhead_, BT * C);
    Kokkos::deep_copy(dlnf_, dhead_);
  }
  Kokkos::deep_copy(dres_, 0.f);
  const FloatView& last = layers_.empty() ? encoded_ : layers_.back()->out();
  lnf_.backward(dres_, dlnf_, last, lnf_mean_, lnf_rstd_, R);
  Kokkos::fence();
  for (std::int64_t l = static_cast<std::int64_t>(layers_.size()) - 1; l >= 0; --l) {
    const FloatView& in = l == 0 ? encoded_ : layers_[l - 1]->out();
    layers_[l]->backward(dres_, in, *scratch_);
  }
  dropout_backward(dres_, dres_, R * C, emb_drop);
  add_positions_backward(store_->grad(wpe_), dres_, row0, R, T, C);
  Kokkos::fence();
  // the word-embedding gradient needs every row: all-gather the row split (reduce-scatter's
  // backward); without sequence parallelism dres is already complete on every TP rank.
  FloatView dword = dres_;
  if (sp) {
    ReduceScatterToSequenceParallelRegion::backward(tp_, word_, dres_, R, C);
    dword = word_;
  }
  embedding_lookup_backward(dwte, dword, tokens, vocab_start_, Vl, BT, C);
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
