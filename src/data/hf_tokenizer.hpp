// Hugging Face tokenizers from their tokenizer.json (docs/DESIGN.md "Tokenizers"), written here
// from the library's documented behaviour and checked token for token against its JavaScript
// implementation (tests/data: @huggingface/tokenizers, on the KJV and adversarial text, with the
// real Llama 2, Llama 3 and Qwen 3 files):
//   added tokens    matched first, leftmost-longest, on the raw text (normalized: false) or on each
//                   normalized piece (normalized: true); lstrip / rstrip / single_word honoured;
//                   special and non-special alike (the library's default), their ids emitted as is
//   normalizer      NFC, NFD, NFKC, NFKD (ICU), Lowercase, Prepend, Replace (string or regex),
//                   Strip, Sequence; applied to each piece between added tokens
//   pre_tokenizer   Split (regex or string; Removed, Isolated, MergedWithPrevious,
//                   MergedWithNext, Contiguous; invert), ByteLevel (GPT-2's regex, prefix space,
//                   the byte-to-unicode map), Metaspace (replacement, prepend_scheme, split),
//                   Digits, Sequence
//   model           BPE: merge ranks, ignore_merges, byte_fallback (<0xNN> tokens), unk_token and
//                   fuse_unk, continuing_subword_prefix, end_of_word_suffix
//   post_processor  TemplateProcessing (its single-sequence template: BOS), ByteLevel, Sequence
//   decoder         ByteLevel, ByteFallback, Metaspace, Replace, Fuse, Strip, Sequence
// Regular expressions are Oniguruma's (the Rust library's engine), run by ICU's regex engine after
// a translation of the classes that differ: Oniguruma's \s is [\t\n\v\f\r\x85\p{Z}], ICU's lacks
// \v and U+0085. Input that is not valid UTF-8 is decoded as a WHATWG decoder (and so Node.js)
// decodes it: each maximal invalid subsequence becomes U+FFFD.
// Anything else (another model type, a normalizer, pre-tokenizer or decoder not listed) is refused
// with one error naming the file and the component. Not thread-safe (a word cache and the regex
// matchers are mutable): use one tokenizer per thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.hpp"

namespace trident {

class HfTokenizer : public Tokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one; a tokenizer_config.json beside it names
  // the end-of-document (eos_token) and bos tokens. Throws Error::all naming the file.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer() override;

  // The ids of a text with the post-processor's special tokens (the library's default,
  // add_special_tokens = true: Llama's BOS).
  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const override;
  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out, bool add_special_tokens) const;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens) const;

  std::int64_t vocab_size() const override;
  SpecialTokens specials() const override;
  bool continues_word(std::int32_t id) const override;
  // The token string of an id (the model's vocabulary or an added token).
  const std::string& token(std::int32_t id) const;
  // The id of a token string, -1 when absent.
  std::int32_t token_id(const std::string& token) const;
  // The files read: the tokenizer.json, and the tokenizer_config.json beside it when there is one.
  const std::vector<std::string>& files() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Input text as a WHATWG UTF-8 decoder reads it: valid UTF-8 unchanged, each maximal invalid
// subsequence replaced by U+FFFD (EF BF BD).
std::string sanitize_utf8(std::string_view bytes);

}  // namespace trident
