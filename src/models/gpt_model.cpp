// GPT: the causal stack with the tied LM head (gpt_model.hpp).
#include "models/gpt_model.hpp"

#include "common/error.hpp"
#include "models/lm_head.hpp"

namespace trident {

void GptModel::set_spec(TransformerConfig& cfg) {
  cfg.layer = LayerSpec{MaskKind::Causal, false};
  cfg.num_token_types = 0;
  cfg.decoder_layers = cfg.decoder_seq_length = 0;
}

GptModel::GptModel(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp,
                   const ModelStage& stage)
    : LanguageModel(cfg, store, micro_batch, tp, stage) {
  TRIDENT_REQUIRE(cfg.layer.mask == MaskKind::Causal && cfg.num_token_types == 0 && !cfg.encoder_decoder(),
                  "internal: GptModel needs GPT's layer spec (causal, no token types, no decoder)");
  if (stage.post)
    attach_head(std::make_unique<LmHead>(store, output_weights(), micro_batch, cfg.seq_length, cfg.hidden_size,
                                         cfg.vocab_size, vocab_local(), vocab_start(), tp, cfg.dt,
                                         /*with_bias=*/false, /*per_target_mean=*/cfg.per_target_loss));
}

}  // namespace trident
