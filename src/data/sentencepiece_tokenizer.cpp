#include "data/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include "common/error.hpp"

namespace trident {

struct SentencePieceTokenizer::Impl {
  std::string path;
  sentencepiece::SentencePieceProcessor sp;
  SpecialTokens specials;
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = model_path;
  const auto st = impl_->sp.Load(model_path);
  TRIDENT_REQUIRE(st.ok(), "SentencePiece model '" << model_path << "' cannot be loaded: " << st.error_message());
  impl_->specials.eod = impl_->sp.eos_id();
  impl_->specials.bos = impl_->sp.bos_id();
  impl_->specials.unk = impl_->sp.unk_id();
  impl_->specials.pad = impl_->sp.pad_id();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_append(std::string_view utf8, std::vector<std::int32_t>& out) const {
  std::vector<int> ids;
  const auto st = impl_->sp.Encode(absl::string_view(utf8.data(), utf8.size()), &ids);
  TRIDENT_REQUIRE(st.ok(), "SentencePiece model '" << impl_->path << "': encoding failed: " << st.error_message());
  if (impl_->specials.bos >= 0) out.push_back(impl_->specials.bos);
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  const std::vector<int> v(ids.begin(), ids.end());
  for (const int id : v)
    TRIDENT_REQUIRE(id >= 0 && id < impl_->sp.GetPieceSize(), "SentencePiece model '"
                                                                  << impl_->path << "': id " << id << " is outside [0, "
                                                                  << impl_->sp.GetPieceSize() << ")");
  std::string text;
  const auto st = impl_->sp.Decode(v, &text);
  TRIDENT_REQUIRE(st.ok(), "SentencePiece model '" << impl_->path << "': decoding failed: " << st.error_message());
  return text;
}

std::int64_t SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

SpecialTokens SentencePieceTokenizer::specials() const { return impl_->specials; }

bool SentencePieceTokenizer::continues_word(std::int32_t id) const {
  if (id < 0 || id >= impl_->sp.GetPieceSize() || impl_->sp.IsControl(id)) return false;
  const std::string& p = impl_->sp.IdToPiece(id);
  return p.compare(0, 3, "\xE2\x96\x81") != 0;  // a word starts at U+2581
}

}  // namespace trident
