// GPT-2 (DESIGN.md): learned absolute positions, pre-LayerNorm layers (eps from the deck),
// GELU (tanh), tied input/output word embeddings, causal attention, init normal(0, std) with the
// output projections (attention proj, fc2) scaled by 1/sqrt(2 * num_layers).
// Tensor parallel as Megatron: vocabulary-parallel word embedding (rows of the padded
// vocabulary split over TP) and vocabulary-parallel cross-entropy on the tied LM head, so the
// full logits never meet on one rank; transformer layers split by heads and MLP columns;
// optional sequence parallelism outside the tensor-parallel regions. Padded logits are masked,
// so neither losses nor gradients depend on the padding or on tp. Checkpoints store the
// unpadded, unsharded [vocab_size, C].
#pragma once
#include <memory>
#include <vector>

#include "layers/param_store.hpp"
#include "layers/transformer_layer.hpp"

namespace trident {

struct GptConfig {
  std::int64_t num_layers = 0, hidden = 0, heads = 0, ffn = 0, seq_length = 0, max_positions = 0;
  std::int64_t vocab_size = 0, padded_vocab = 0;
  float ln_eps = 1e-5f, init_std = 0.02f;
  float hidden_dropout = 0.f, attention_dropout = 0.f;
};

class GptModel {
 public:
  // micro_batch: B of every forward call. tp: the tensor-parallel group (nullptr comm: tp = 1).
  GptModel(const GptConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp = {});

  // Forward over tokens (B*T) with targets (B*T), no dropout; returns the SUM of the token
  // losses of the first `samples` samples (all B when negative).
  double forward(const IntView& tokens, const IntView& targets, std::int64_t samples = -1);
  // Forward + backward with dropout drawn from `rng`; gradients of (dscale * sum of token
  // losses) are ACCUMULATED into the store's gradient buffer. Returns the sum of token losses.
  double forward_backward(const IntView& tokens, const IntView& targets, float dscale,
                          const DropoutStreams& rng = {});

  const GptConfig& config() const { return cfg_; }
  std::int64_t micro_batch() const { return B_; }
  // Model FLOPs per step, Megatron's formula without recomputation:
  // 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) with V the padded vocabulary.
  double flops_per_step(std::int64_t tokens_batch) const;

 private:
  double run(const IntView& tokens, const IntView& targets, bool backward, float dscale, std::int64_t samples,
             const DropoutStreams& rng);
  DropoutSpec embedding_dropout(const DropoutStreams& rng) const;

  GptConfig cfg_;
  ParamStore* store_;
  TensorParallel tp_;
  std::int64_t B_, rows_, local_rows_, vocab_local_, vocab_start_;
  ParamId wte_ = -1, wpe_ = -1;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  LayerNorm lnf_;
  std::unique_ptr<TransformerScratch> scratch_;
  FloatView word_, encoded_, lnf_out_, lnf_mean_, lnf_rstd_, head_in_, logits_, losses_, dres_, dlnf_, dhead_;
  FloatView ce_scratch_;
};

}  // namespace trident
