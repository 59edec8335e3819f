// A GPT-family checkpoint loaded for inference (generate_gpt, serve_gpt): every world rank one
// tensor-parallel rank (pp = 1), fp32 parameters whatever the training precision, no dropout or
// recomputation, the tokenizer of the app's options checked against the model's vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "comm/topology.hpp"
#include "data/tokenizer.hpp"
#include "layers/param_store.hpp"
#include "models/gpt_model.hpp"
#include "models/transformer_config.hpp"

namespace trident {

struct TokenizerOptions {
  std::string type = "GPT2BPETokenizer";  // GPT2BPETokenizer | HuggingFaceTokenizer | SentencePieceTokenizer
  std::string vocab, merges;              // GPT-2's encoder.json and vocab.bpe
  std::string model;                      // tokenizer.json (or its directory) or a SentencePiece .model
};

struct InferenceModel {
  // app: the name errors start with; checkpoint: a save directory (its latest), an iter_*
  // directory or a file. Collective over MPI_COMM_WORLD.
  InferenceModel(const std::string& app, const std::string& checkpoint, const TokenizerOptions& tokenizer);
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  std::string file;  // the checkpoint file loaded
  Topology topo;
  TransformerConfig cfg;
  TensorParallel tp;
  ParamStore store;
  std::unique_ptr<GptModel> model;
  CheckpointState state;
  std::unique_ptr<Tokenizer> tokenizer;
  bool gpt2 = true;  // GPT-2's BPE (the whole vocabulary) rather than an open model's tokenizer
};

}  // namespace trident
