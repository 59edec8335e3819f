// BERT's WordPiece tokenizer (Devlin et al. 2019; Google's tokenization.py, which Megatron
// uses), over a vocab.txt (one token per line, id = line number):
//   basic tokenization: drop NUL, U+FFFD and control characters (general category C*, except
//   tab, newline and carriage return, which are white space); map white space (space, tab, CR,
//   LF, category Zs) to spaces; surround CJK ideographs with spaces; split on white space;
//   lower-cased form: lower-case each word (full Unicode case mapping, final sigma included) and
//   strip accents (NFD, then drop non-spacing marks, category Mn); split off every punctuation
//   character (ASCII 33-47, 58-64, 91-96, 123-126, and Unicode categories P*);
//   WordPiece: each word of at most 100 characters becomes the greedy longest-match-first
//   pieces of the vocabulary, pieces after the first prefixed with "##"; a longer word, or one
//   that cannot be covered, becomes [UNK].
// Character classes and case mapping come from ICU, so they follow ICU's Unicode version
// (Python's unicodedata may be one version older: differences only on newly added characters).
#pragma once
#include <string>
#include <unordered_map>

#include "data/tokenizer.hpp"

namespace trident {

class WordPieceTokenizer : public Tokenizer {
 public:
  // Throws Error::all naming the file when it cannot be read, has duplicate tokens, or lacks
  // [UNK], [CLS], [SEP], [MASK] or [PAD].
  WordPieceTokenizer(const std::string& vocab_path, bool lower_case);

  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const override;
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(tokens_.size()); }
  SpecialTokens specials() const override { return specials_; }
  bool continues_word(std::int32_t id) const override { return token(id).compare(0, 2, "##") == 0; }

  // The words of the basic tokenization (exposed for tests).
  std::vector<std::string> basic_tokenize(std::string_view utf8) const;
  const std::string& token(std::int32_t id) const { return tokens_.at(static_cast<std::size_t>(id)); }

  static constexpr std::size_t kMaxCharsPerWord = 100;

 private:
  void wordpiece(const std::u32string& word, std::vector<std::int32_t>& out) const;
  std::int32_t find(const std::string& piece) const;

  bool lower_case_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::int32_t> ids_;
  SpecialTokens specials_;
};

}  // namespace trident
