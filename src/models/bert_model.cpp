// BERT: the padding-masked encoder with token types and BERT's heads (bert_model.hpp).
#include "models/bert_model.hpp"

#include "common/error.hpp"
#include "models/bert_head.hpp"

namespace trident {

void BertModel::set_spec(TransformerConfig& cfg, std::int64_t num_token_types) {
  cfg.layer = LayerSpec{MaskKind::Padding, false};
  cfg.num_token_types = num_token_types;
  cfg.decoder_layers = cfg.decoder_seq_length = 0;
}

BertModel::BertModel(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch,
                     const TensorParallel& tp, const ModelStage& stage, bool binary_head)
    : LanguageModel(cfg, store, micro_batch, tp, stage) {
  TRIDENT_REQUIRE(cfg.padding_mask() && cfg.num_token_types > 0 && !cfg.encoder_decoder(),
                  "internal: BertModel needs BERT's layer spec (padding mask, token types, no decoder)");
  if (stage.post)
    attach_head(std::make_unique<BertHead>(store, word_embeddings(), micro_batch, cfg.seq_length, cfg.hidden_size,
                                           cfg.vocab_size, vocab_local(), vocab_start(), cfg.init_std(), cfg.eps(),
                                           binary_head, tp, cfg.dt));
}

void BertModel::allocate_head_inputs(MicroBatch& mb) const {
  mb.sentence_order = make_int("micro_batch::sentence_order", micro_batch());
}

}  // namespace trident
