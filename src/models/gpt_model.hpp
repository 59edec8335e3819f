// GPT (pretrain_gpt, generate_gpt): a decoder-only stack of causal layers over learned absolute
// positions, with the tied LM head and vocabulary-parallel cross-entropy (models/lm_head). Its
// loss, as the trainer and the evaluation mode count it, is the SUM of the token losses of a
// micro-batch; checkpoint names: model/embedding/{word,position}_embeddings,
// model/layers/N/..., model/final_layernorm (docs/DESIGN.md "Checkpoints").
#pragma once
#include "models/language_model.hpp"

namespace trident {

class GptModel : public LanguageModel {
 public:
  // The layer spec of GPT: causal layers, no token types, no decoder.
  static void set_spec(TransformerConfig& cfg);
  // cfg must carry GPT's spec (set_spec); micro_batch: B of every forward call.
  GptModel(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp = {},
           const ModelStage& stage = {});
};

}  // namespace trident
