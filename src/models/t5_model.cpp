// T5: the encoder-decoder stack with a biased LM head over the decoder targets (t5_model.hpp).
#include "models/t5_model.hpp"

#include "common/error.hpp"
#include "models/lm_head.hpp"

namespace trident {

void T5Model::set_spec(TransformerConfig& cfg, std::int64_t decoder_layers, std::int64_t decoder_seq_length) {
  cfg.layer = LayerSpec{MaskKind::Padding, false};
  cfg.num_token_types = 0;
  cfg.decoder_layers = decoder_layers;
  cfg.decoder_seq_length = decoder_seq_length;
  cfg.decoder_layer = LayerSpec{MaskKind::Causal, true};
}

T5Model::T5Model(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp,
                 const ModelStage& stage)
    : LanguageModel(cfg, store, micro_batch, tp, stage) {
  TRIDENT_REQUIRE(cfg.padding_mask() && cfg.encoder_decoder() && cfg.num_token_types == 0,
                  "internal: T5Model needs T5's layer spec (padding-masked encoder, a decoder, no token types)");
  if (stage.post)
    attach_head(std::make_unique<LmHead>(store, word_embeddings(), micro_batch, cfg.decoder_seq_length, cfg.hidden_size,
                                         cfg.vocab_size, vocab_local(), vocab_start(), tp, cfg.dt,
                                         /*with_bias=*/true, /*per_target_mean=*/true));
}

}  // namespace trident
