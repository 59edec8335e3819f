// SentencePiece models (.model files, Llama 1/2's original tokenizer, T5's, many others) through the
// SentencePiece library itself (Debian's libsentencepiece), not a reimplementation: the library's
// encoding (its normalizer, unigram or BPE model and byte fallback as the model file says), its
// decoding, and its special ids. Each text gets <s> (bos_id) first when the model has one, as
// Llama's tokenizer adds it; </s> (eos_id) is the end-of-document token.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.hpp"

namespace trident {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws Error::all naming the file when it cannot be loaded.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;
  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  SpecialTokens specials() const override;
  bool continues_word(std::int32_t id) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident
