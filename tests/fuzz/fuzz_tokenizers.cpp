// libFuzzer harness: the tokenizers, on the sample vocabularies (TRIDENT_FUZZ_SAMPLE: the
// data/sample directory). GPT-2's byte-level BPE must give back every byte string exactly
// (decode(encode(x)) == x, valid UTF-8 or not) with ids inside the vocabulary; both WordPiece
// variants must give ids inside theirs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "data/gpt2_tokenizer.hpp"
#include "data/wordpiece_tokenizer.hpp"

namespace {
std::unique_ptr<trident::Gpt2Tokenizer> gpt2;
std::unique_ptr<trident::WordPieceTokenizer> lower, cased;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("TRIDENT_FUZZ_SAMPLE");
  if (!dir) {
    std::fprintf(stderr, "set TRIDENT_FUZZ_SAMPLE to the sample data directory (data/sample)\n");
    std::exit(2);
  }
  const std::string d = dir;
  gpt2 = std::make_unique<trident::Gpt2Tokenizer>(d + "/gpt2/encoder.json", d + "/gpt2/vocab.bpe");
  lower = std::make_unique<trident::WordPieceTokenizer>(d + "/bert/vocab.txt", true);
  cased = std::make_unique<trident::WordPieceTokenizer>(d + "/bert/vocab.txt", false);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto ids = gpt2->encode(text);
  for (auto id : ids)
    if (id < 0 || id >= gpt2->vocab_size()) std::abort();
  if (gpt2->decode(ids) != text) {
    std::fprintf(stderr, "GPT-2 BPE: decode(encode(x)) != x for %zu bytes\n", size);
    std::abort();
  }
  for (const auto* wp : {lower.get(), cased.get()})
    for (auto id : wp->encode(text))
      if (id < 0 || id >= wp->vocab_size()) std::abort();
  return 0;
}
