// Tokenizer factory (make_tokenizer: Megatron's type names to Gpt2Tokenizer or
// WordPieceTokenizer) and two wrappers: GPT-2's BPE with [CLS] [SEP] [MASK] [PAD] appended after
// its vocabulary, and any tokenizer with T5's [BOS], [EOS] and extra-id sentinels appended.
#include "data/tokenizer.hpp"

#include "common/error.hpp"
#include "common/sha256.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/hf_tokenizer.hpp"
#include "data/sentencepiece_tokenizer.hpp"
#include "data/wordpiece_tokenizer.hpp"

namespace trident {

namespace {

// GPT-2's BPE; [CLS] [SEP] [MASK] [PAD] get the ids after the vocabulary's last one (Megatron's
// additional special tokens), and [UNK] is not needed (byte-level BPE covers every input).
class BpeWithBertSpecials : public Tokenizer {
 public:
  BpeWithBertSpecials(const std::string& vocab, const std::string& merges) : bpe_(vocab, merges) {
    const auto n = static_cast<std::int32_t>(bpe_.vocab_size());
    specials_.eod = bpe_.eod_id();
    specials_.cls = n;
    specials_.sep = n + 1;
    specials_.mask = n + 2;
    specials_.pad = n + 3;
  }
  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const override {
    bpe_.encode_append(utf8, out);
  }
  std::int64_t vocab_size() const override { return bpe_.vocab_size() + 4; }
  SpecialTokens specials() const override { return specials_; }
  bool continues_word(std::int32_t id) const override { return id < bpe_.vocab_size() && bpe_.continues_word(id); }

 private:
  Gpt2Tokenizer bpe_;
  SpecialTokens specials_;
};

// Any tokenizer with [BOS], [EOS] and extra_ids sentinels appended (T5).
class WithExtraIds : public Tokenizer {
 public:
  WithExtraIds(std::unique_ptr<Tokenizer> base, int extra_ids) : base_(std::move(base)), extra_(extra_ids) {
    specials_ = base_->specials();
    const auto n = static_cast<std::int32_t>(base_->vocab_size());
    specials_.bos = n;
    specials_.eos = n + 1;
    specials_.sentinel = n + 2;
    specials_.num_sentinels = extra_ids;
  }
  void encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const override {
    base_->encode_append(utf8, out);
  }
  std::int64_t vocab_size() const override { return base_->vocab_size() + 2 + extra_; }
  SpecialTokens specials() const override { return specials_; }
  bool continues_word(std::int32_t id) const override { return id < base_->vocab_size() && base_->continues_word(id); }

 private:
  std::unique_ptr<Tokenizer> base_;
  int extra_;
  SpecialTokens specials_;
};

std::unique_ptr<Tokenizer> make_base(const std::string& type, const std::string& vocab, const std::string& merges,
                                     const std::string& model) {
  const bool bpe = type == "GPT2BPETokenizer" || type == "GPT2BPEWithBertSpecials";
  const bool wordpiece = type == "BertWordPieceLowerCase" || type == "BertWordPieceCase";
  if (type == "HuggingFaceTokenizer") {
    TRIDENT_REQUIRE(!model.empty(),
                    "tokenizer HuggingFaceTokenizer needs its tokenizer.json (--tokenizer-model, "
                    "data.tokenizer_model)");
    return std::make_unique<HfTokenizer>(model);
  }
  if (type == "SentencePieceTokenizer") {
    TRIDENT_REQUIRE(!model.empty(),
                    "tokenizer SentencePieceTokenizer needs its .model file (--tokenizer-model, "
                    "data.tokenizer_model)");
    return std::make_unique<SentencePieceTokenizer>(model);
  }
  TRIDENT_REQUIRE(bpe || wordpiece, "unknown tokenizer type '" << type << "' (" << tokenizer_types() << ")");
  TRIDENT_REQUIRE(!vocab.empty(),
                  "tokenizer " << type << " needs a vocabulary file (" << (bpe ? "encoder.json" : "vocab.txt") << ")");
  if (wordpiece) return std::make_unique<WordPieceTokenizer>(vocab, type == "BertWordPieceLowerCase");
  TRIDENT_REQUIRE(!merges.empty(), "tokenizer " << type << " needs a merges file (vocab.bpe)");
  if (type == "GPT2BPETokenizer") return std::make_unique<Gpt2Tokenizer>(vocab, merges);
  return std::make_unique<BpeWithBertSpecials>(vocab, merges);
}

}  // namespace

const char* tokenizer_types() {
  return "GPT2BPETokenizer, GPT2BPEWithBertSpecials, BertWordPieceLowerCase, BertWordPieceCase, HuggingFaceTokenizer, "
         "SentencePieceTokenizer";
}

std::string Tokenizer::decode(const std::vector<std::int32_t>&) const {
  throw Error::all(
      "this tokenizer has no decoder (WordPiece): decoding needs GPT-2's BPE, a Hugging Face or a "
      "SentencePiece tokenizer");
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab, const std::string& merges,
                                          int extra_ids, const std::string& model) {
  TRIDENT_REQUIRE(extra_ids >= 0, "the number of extra vocabulary ids must be >= 0, got " << extra_ids);
  auto base = make_base(type, vocab, merges, model);
  // the digest: the type, the extra ids and the digests of the files that define the tokenizer
  std::string id = type + "\n" + std::to_string(extra_ids) + "\n";
  std::vector<std::string> files = {vocab, merges, model};
  if (const auto* hf = dynamic_cast<const HfTokenizer*>(base.get())) files = hf->files();
  for (const std::string& f : files)
    if (!f.empty()) id += sha256_file(f) + "\n";
  std::unique_ptr<Tokenizer> tok = extra_ids == 0 ? std::move(base)
                                                  : std::make_unique<WithExtraIds>(std::move(base), extra_ids);
  tok->set_digest(sha256_hex(id));
  return tok;
}

}  // namespace trident
