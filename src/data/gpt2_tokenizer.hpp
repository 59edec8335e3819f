// GPT-2's byte-level BPE tokenizer, reproducing OpenAI's encoder exactly:
//   1. pre-tokenization with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      matched by hand over code points (letter / number / white-space classes from ICU);
//   2. each piece's UTF-8 bytes go through byte-level BPE with the merge ranks of the merges
//      file (lowest rank first, all occurrences of a pair left to right), and the resulting
//      symbols are looked up in the vocabulary.
// Internally every symbol is a byte string, so the byte-to-unicode table of GPT-2 is only
// needed to read the vocabulary and merges files (their keys are written in it).
//
// Policy for bytes that are not valid UTF-8 (truncated or overlong sequences, encoded
// surrogates, code points above U+10FFFF, stray continuation bytes): each such byte is one
// "character" of the class "neither white space, letter nor number", exactly as Python's
// bytes.decode("utf-8", "surrogateescape") would turn it into a lone surrogate (general
// category Cs). It joins the ` ?[^\s\p{L}\p{N}]+` pieces and is encoded as its own raw byte,
// so decode(encode(x)) == x for EVERY byte string x, valid UTF-8 or not.
//
// White space (\s) is Unicode's White_Space property (u_isUWhiteSpace), the definition of
// Python's `regex` module used by GPT-2. JavaScript's \s differs on U+FEFF (JS: space) and
// U+0085 / U+180E-like characters (see data/README.md); plain text rarely holds them.
//
// Not thread-safe: encode() fills a word cache (mutable). Use one tokenizer per thread.
//
// "<|endoftext|>" in the input text is NOT special: like GPT-2's encoder it is split as
// ordinary text. Append eod_id() yourself to mark document ends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.hpp"

namespace trident {

class Gpt2Tokenizer : public Tokenizer {
 public:
  // vocab_path: encoder.json / vocab.json (JSON object: token -> id, tokens written with
  // GPT-2's byte-to-unicode map). merges_path: vocab.bpe / merges.txt (one "a b" merge per
  // line, rank = line order; a first line starting with "#version" is skipped).
  // Throws Error::all naming the file on any problem.
  Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path);

  // Token ids of a UTF-8 text (any bytes accepted, see the policy above).
  std::vector<std::int32_t> encode(std::string_view utf8) const;
  // Appends the ids of `utf8` to `out` (no allocation of a new vector per call).
  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const override;
  // The exact bytes of the tokens, concatenated (the result need not be valid UTF-8 when the
  // ids split a character). Throws Error::all on an id outside [0, vocab_size()).
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  // The raw bytes of one token.
  const std::string& token_bytes(std::int32_t id) const;

  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(id_to_bytes_.size()); }
  SpecialTokens specials() const override {
    SpecialTokens s;
    s.eod = eod_id_;
    return s;
  }
  bool continues_word(std::int32_t id) const override;
  std::size_t num_merges() const { return num_merges_; }

  // Splits text into GPT-2's pre-tokenization pieces (byte ranges); exposed for tests.
  std::vector<std::string_view> pretokenize(std::string_view utf8) const;

  // Words cached so far (the cache is cleared when it grows past a bound).
  std::size_t cache_size() const { return cache_.size(); }

 private:
  // Character classes of the pre-tokenizer.
  enum CharClass : std::uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };
  CharClass classify(std::uint32_t cp) const;
  // Decodes one code point at s[i] (strict UTF-8); returns the byte length and sets cls.
  // An invalid byte has length 1 and class kOther.
  std::size_t next_char(std::string_view s, std::size_t i, CharClass& cls, std::uint32_t& cp) const;
  // Calls emit(piece) for each pre-tokenization piece of s, in order.
  template <class Emit>
  void scan(std::string_view s, Emit&& emit) const;
  // Byte-level BPE of one pre-token, appending ids.
  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;

  std::vector<std::string> id_to_bytes_;  // id -> raw bytes
  std::unordered_map<std::string, std::int32_t> bytes_to_id_;
  // Symbols: ids in a symbol space that extends the vocabulary with merge parts/results that
  // are not in it (none in GPT-2's files, but a merges file may hold some).
  std::vector<std::string> symbol_bytes_;   // symbol -> raw bytes
  std::vector<std::int32_t> symbol_to_id_;  // symbol -> vocab id or -1
  std::int32_t byte_symbol_[256];           // single byte -> symbol
  struct Merge {
    std::uint32_t rank;
    std::int32_t result;  // symbol
  };
  std::unordered_map<std::uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  std::size_t num_merges_ = 0;
  std::int32_t eod_id_ = -1;
  std::vector<std::uint8_t> bmp_class_;  // CharClass of U+0000..U+FFFF
  std::string vocab_path_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

}  // namespace trident
