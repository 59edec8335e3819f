// GPT pretraining and evaluation driven by a deck: the body of apps/pretrain_gpt.
#pragma once
#include <cstdint>

#include "io/deck.hpp"
#include "models/gpt_model.hpp"

namespace trident {

// Runs training (or, with eval.only, the evaluation mode of DESIGN.md). Collective over
// MPI_COMM_WORLD. Returns the process exit code.
int run_gpt(const Deck& deck);
// BERT pretraining (apps/pretrain_bert): the same loop with BERT's samples, model and losses.
int run_bert(const Deck& deck);
// T5 pretraining (apps/pretrain_t5): span corruption, the encoder-decoder model, its LM loss.
int run_t5(const Deck& deck);
// The GPT model of a deck (shapes, dropout, recomputation, precision) for a vocabulary of `vocab`
// tokens padded for tensor-parallel size tp (generation and tools build the training model alike).
GptConfig gpt_config_from_deck(const Deck& deck, std::int64_t vocab, std::int64_t tp);

}  // namespace trident
