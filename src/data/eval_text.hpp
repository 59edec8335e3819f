// Text scored by the evaluation mode (docs/DESIGN.md "Evaluation mode"): a JSON-lines file (.json
// / .jsonl, one document per line under a key) or any other file as one plain-text document,
// compressed or not (.gz, .zst, .xz), tokenized in memory as preprocess_data --append-eod would
// shard it: each non-empty document's tokens followed by the end-of-document token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"

namespace trident {

struct TokenizedText {
  std::vector<std::int32_t> tokens;
  std::int64_t documents = 0;  // non-empty documents
  std::int64_t bytes = 0;      // UTF-8 bytes of their text
};

// True when `path` names text rather than a token corpus: an existing file that is neither HDF5
// nor a Megatron .bin/.idx pair (nor its prefix).
bool is_text_file(const std::string& path);

// Throws Error::all naming the file (and line) on unreadable input or a malformed JSON line.
TokenizedText tokenize_text_file(const std::string& path, const Tokenizer& tok, const std::string& json_key);

}  // namespace trident
