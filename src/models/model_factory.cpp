// The model families by name (model_factory.hpp).
#include "models/model_factory.hpp"

#include "models/bert_model.hpp"
#include "models/gpt_model.hpp"
#include "models/t5_model.hpp"

namespace trident {

const char* family_name(ModelFamily f) { return f == ModelFamily::Bert ? "bert" : f == ModelFamily::T5 ? "t5" : "gpt"; }

void set_family_spec(ModelFamily f, TransformerConfig& cfg, std::int64_t decoder_layers,
                     std::int64_t decoder_seq_length) {
  switch (f) {
    case ModelFamily::Gpt: GptModel::set_spec(cfg); break;
    case ModelFamily::Bert: BertModel::set_spec(cfg); break;
    case ModelFamily::T5: T5Model::set_spec(cfg, decoder_layers, decoder_seq_length); break;
  }
}

std::unique_ptr<LanguageModel> make_model(ModelFamily f, const TransformerConfig& cfg, ParamStore& store,
                                          std::int64_t micro_batch, const TensorParallel& tp, const ModelStage& stage,
                                          const HeadOptions& head) {
  switch (f) {
    case ModelFamily::Bert: return std::make_unique<BertModel>(cfg, store, micro_batch, tp, stage, head.binary_head);
    case ModelFamily::T5: return std::make_unique<T5Model>(cfg, store, micro_batch, tp, stage);
    case ModelFamily::Gpt: break;
  }
  return std::make_unique<GptModel>(cfg, store, micro_batch, tp, stage);
}

}  // namespace trident
