// The tokenizers behind one interface (Megatron's --tokenizer-type names):
//   GPT2BPETokenizer          GPT-2's byte-level BPE (data/gpt2_tokenizer), EOD <|endoftext|>
//   GPT2BPEWithBertSpecials   the same, plus [CLS] [SEP] [MASK] [PAD] appended to the
//                             vocabulary (ids 50257..50260 with GPT-2's files), for BERT and T5
//                             users without a WordPiece vocabulary
//   BertWordPieceLowerCase    BERT's WordPiece (data/wordpiece_tokenizer), lower-cased, accents
//   BertWordPieceCase         stripped / cased
//   HuggingFaceTokenizer      a Hugging Face tokenizer.json (data/hf_tokenizer: Llama 2 and 3,
//                             Mistral, Qwen, ...); EOD its tokenizer_config.json's eos_token;
//                             the post-processor's special tokens (BOS) added to each text
//   SentencePieceTokenizer    a SentencePiece .model through the SentencePiece library
//                             (data/sentencepiece_tokenizer); EOD its </s>, BOS <s> added
// GPT-2's and WordPiece's special tokens are never produced from text: "[MASK]" in the input is
// tokenized as ordinary characters, as BERT's and GPT-2's own tokenizers do. Hugging Face
// tokenizers match their added tokens in the text, as the library does.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/special_tokens.hpp"

namespace trident {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of a UTF-8 text to out.
  virtual void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const = 0;
  std::vector<std::int32_t> encode(std::string_view utf8) const {
    std::vector<std::int32_t> out;
    encode_append(utf8, out);
    return out;
  }
  virtual std::int64_t vocab_size() const = 0;
  virtual SpecialTokens specials() const = 0;
  std::int32_t eod_id() const { return specials().eod; }
  // Whether token `id` continues the word of the token before it (whole-word masking):
  // WordPiece's "##" pieces; for GPT-2's BPE, tokens that do not start with a space, a
  // punctuation character or a line break (a heuristic: BPE marks word starts by the space).
  virtual bool continues_word(std::int32_t id) const = 0;
  // The text of `ids` (GPT-2's BPE: the tokens' exact bytes; Hugging Face's and SentencePiece
  // tokenizers: their decoders). Tokenizers without a decoder (WordPiece) throw Error::all.
  virtual std::string decode(const std::vector<std::int32_t>& ids) const;
  // What names this tokenizer in token shards (their `tokenizer_digest`): the SHA-256 of its type
  // and of its files' SHA-256 digests, set by make_tokenizer; "" for a tokenizer made otherwise.
  const std::string& digest() const { return digest_; }
  void set_digest(std::string d) { digest_ = std::move(d); }

 private:
  std::string digest_;
};

// type: one of the names above. vocab: encoder.json (BPE) or vocab.txt (WordPiece); merges:
// vocab.bpe (BPE only); model: the tokenizer.json (or its directory) of HuggingFaceTokenizer, the
// .model file of SentencePieceTokenizer. extra_ids > 0 (Megatron's --vocab-extra-ids, for T5)
// appends [BOS], [EOS] and the sentinels <extra_id_0> .. <extra_id_{extra_ids-1}> after the
// vocabulary's last id, in that order. Throws Error::all naming the type or file on any problem.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab, const std::string& merges,
                                          int extra_ids = 0, const std::string& model = "");
// The accepted type names, for messages.
const char* tokenizer_types();

}  // namespace trident
