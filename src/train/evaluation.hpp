// The evaluation mode (eval.only = true, docs/DESIGN.md "Evaluation mode"): the checkpoint of
// checkpoint.load scored on eval.shard without dropout, under any tp/pp/dp layout.
//   GPT: eval.windows disjoint windows of seq_length + 1 tokens; prints the mean token loss and
//        the perplexity.
//   BERT, T5: the first eval.windows samples of the family's dataset over every document of
//        eval.shard; prints the LM loss over all labelled positions (T5: decoder targets) and,
//        for BERT with the sentence-order head, that loss and their sum.
#pragma once
#include "comm/topology.hpp"
#include "io/deck.hpp"
#include "models/model_factory.hpp"

namespace trident {

// Collective over topo's world; returns the process exit code.
int run_evaluation(const Deck& deck, const Topology& topo, ModelFamily family);

}  // namespace trident
