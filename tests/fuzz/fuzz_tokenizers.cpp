// libFuzzer harness: the tokenizers, on the sample vocabularies (TRIDENT_FUZZ_SAMPLE: the
// data/sample directory). GPT-2's byte-level BPE must give back every byte string exactly
// (decode(encode(x)) == x, valid UTF-8 or not) with ids inside the vocabulary; both WordPiece
// variants must give ids inside theirs. The Hugging Face tokenizer.json of Llama 2 (SentencePiece
// BPE with byte fallback), Llama 3 and Qwen 3 (byte-level BPE, Qwen's with NFC) must give ids
// inside their vocabularies and decode them; Llama 3's, which normalizes nothing, must give back
// the text as a WHATWG decoder reads it (sanitize_utf8), encoded without special tokens, with the
// transformers library's clean-up of spaces that its tokenizer_config.json asks for.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"
#include "data/hf_tokenizer.hpp"
#include "data/wordpiece_tokenizer.hpp"

namespace {
std::unique_ptr<trident::Gpt2Tokenizer> gpt2;
std::unique_ptr<trident::WordPieceTokenizer> lower, cased;
std::unique_ptr<trident::HfTokenizer> llama2, llama3, qwen3;
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
  llama2 = std::make_unique<trident::HfTokenizer>(d + "/hf/llama2");
  llama3 = std::make_unique<trident::HfTokenizer>(d + "/hf/llama3");
  qwen3 = std::make_unique<trident::HfTokenizer>(d + "/hf/qwen3");
  return 0;
}

// transformers' clean_up_tokenization: these replacements, in this order
static std::string clean_up_spaces(std::string s) {
  const char* const pairs[][2] = {{" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
                                  {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& p : pairs) {
    const std::string from = p[0], to = p[1];
    std::string out;
    std::size_t at = 0;
    for (std::size_t k; (k = s.find(from, at)) != std::string::npos; at = k + from.size())
      out += s.substr(at, k - at) + to;
    s = out + s.substr(at);
  }
  return s;
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
  for (const auto* hf : {llama2.get(), llama3.get(), qwen3.get()}) {
    const auto hf_ids = hf->encode(text);
    for (auto id : hf_ids)
      if (id < 0 || id >= hf->vocab_size()) std::abort();
    (void)hf->decode(hf_ids, true);
  }
  std::vector<std::int32_t> plain;
  llama3->encode_append(text, plain, false);
  if (llama3->decode(plain, false) != clean_up_spaces(trident::sanitize_utf8(text))) {
    std::fprintf(stderr, "Llama 3: decode(encode(x)) != x (WHATWG-decoded) for %zu bytes\n", size);
    std::abort();
  }
  return 0;
}
