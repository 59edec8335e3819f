// BERT (pretrain_bert): a bidirectional encoder under the micro-batch's padding mask, with
// token-type embeddings, and BERT's heads (models/bert_head: masked LM on the tied word
// embeddings, sentence order on the pooled [CLS] position when binary_head). Its loss is
// mlm + sop, the means of the micro-batch, and its loss parts name them (LossParts lm, sop).
// Checkpoint names: the stack's (model/embedding/..., model/layers/N/..., model/final_layernorm,
// plus model/embedding/tokentype_embeddings) and the heads' (bert_head.hpp).
#pragma once
#include "models/language_model.hpp"

namespace trident {

class BertModel : public LanguageModel {
 public:
  // The layer spec of BERT: padding-masked layers, num_token_types token types, no decoder.
  static void set_spec(TransformerConfig& cfg, std::int64_t num_token_types = 2);
  // cfg must carry BERT's spec (set_spec); binary_head: the sentence-order head (and pooler).
  BertModel(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp = {},
            const ModelStage& stage = {}, bool binary_head = true);

 protected:
  void allocate_head_inputs(MicroBatch& mb) const override;  // sentence-order labels (B)
};

}  // namespace trident
