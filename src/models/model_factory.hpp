// The model families by name: the one switch from a family to its class, used by the trainer,
// the evaluation mode and the tools (train/, apps/).
#pragma once
#include <memory>

#include "models/language_model.hpp"

namespace trident {

enum class ModelFamily { Gpt, Bert, T5 };

// "gpt", "bert", "t5": the name checkpoints record (docs/DESIGN.md "Checkpoints").
const char* family_name(ModelFamily f);

// Options of a family's head that the transformer config does not carry.
struct HeadOptions {
  bool binary_head = true;  // BERT: the sentence-order head
};

// Sets the family's layer spec on cfg (decoder sizes: T5 only).
void set_family_spec(ModelFamily f, TransformerConfig& cfg, std::int64_t decoder_layers = 0,
                     std::int64_t decoder_seq_length = 0);

// One chunk of a family's model (ModelStage: the whole model by default).
std::unique_ptr<LanguageModel> make_model(ModelFamily f, const TransformerConfig& cfg, ParamStore& store,
                                          std::int64_t micro_batch, const TensorParallel& tp = {},
                                          const ModelStage& stage = {}, const HeadOptions& head = {});

}  // namespace trident
