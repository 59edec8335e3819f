// T5 (pretrain_t5, Megatron's encoder-decoder): a padding-masked encoder of num_layers layers,
// then decoder_layers causal layers that cross-attend to the encoder's final LayerNorm output,
// one global layer index over both (so pipeline stages may split anywhere, or at
// parallel.pipeline_split_rank); the LM head on the decoder's rows adds a vocabulary-parallel
// bias, and the loss is the mean cross-entropy over the micro-batch's decoder targets (padding
// excluded), reported as the `lm` loss part. Checkpoint names: model/embedding/...,
// model/encoder/layers/N/..., model/encoder/final_layernorm, model/decoder/layers/N/...,
// model/decoder/final_layernorm, model/lm_head/bias.
#pragma once
#include "models/language_model.hpp"

namespace trident {

class T5Model : public LanguageModel {
 public:
  // The layer spec of T5: padding-masked encoder layers, then decoder_layers causal,
  // cross-attending layers over decoder_seq_length positions; no token types.
  static void set_spec(TransformerConfig& cfg, std::int64_t decoder_layers, std::int64_t decoder_seq_length);
  // cfg must carry T5's spec (set_spec).
  T5Model(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp = {},
          const ModelStage& stage = {});
};

}  // namespace trident
