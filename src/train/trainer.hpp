// The pretraining run of a model family, driven by a deck: the body of apps/pretrain_gpt,
// pretrain_bert and pretrain_t5 (and, with eval.only, their evaluation mode).
#pragma once
#include "io/deck.hpp"
#include "models/model_factory.hpp"

namespace trident {

// Runs training (or, with eval.only, the evaluation mode of docs/DESIGN.md). Collective over
// MPI_COMM_WORLD. Returns the process exit code (docs/DESIGN.md "Exit codes").
int run_training(const Deck& deck, ModelFamily family);

}  // namespace trident
