// T5 dataset: span corruption with sentinels (layout in t5_dataset.hpp). The constructor checks
// the shards' sentences and special tokens and the encoder / decoder lengths; get() reads one
// sentence run, draws geometric spans within the decoder's budget and builds the encoder input,
// decoder input and target, and padding masks; T5Data builds train and valid over one corpus.
#include "data/t5_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.hpp"

namespace trident {

T5Dataset::T5Dataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t encoder_length,
                     std::int64_t decoder_length, std::int64_t num_samples, std::uint64_t seed,
                     const SpecialTokens& specials, std::vector<std::uint8_t> continues_word, const T5Masking& masking,
                     const std::string& name)
    : corpus_(&corpus), enc_len_(encoder_length), dec_len_(decoder_length), seed_(seed), sp_(specials),
      continues_(std::move(continues_word)), m_(masking) {
  TRIDENT_REQUIRE(corpus.has_sentences(), name << " dataset: the shards hold no /sentence_offsets (run preprocess_data "
                                                  "with --split-sentences)");
  TRIDENT_REQUIRE(sp_.pad >= 0 && sp_.bos >= 0 && sp_.eos >= 0 && sp_.num_sentinels > 0,
                  name << " dataset: the shards record no [PAD], [BOS], [EOS] and sentinel ids (tokenizer '"
                       << corpus.tokenizer() << "'; run preprocess_data with --vocab-extra-ids 100)");
  TRIDENT_REQUIRE(static_cast<std::int64_t>(continues_.size()) == corpus.vocab_size(),
                  name << " dataset: the vocabulary has " << continues_.size() << " tokens, the shards "
                       << corpus.vocab_size());
  TRIDENT_REQUIRE(m_.masked_prob > 0 && m_.masked_prob < 1, "t5.mask_prob must be in (0, 1)");
  TRIDENT_REQUIRE(m_.short_seq_prob >= 0 && m_.short_seq_prob <= 1, "t5.short_seq_prob must be in [0, 1]");
  TRIDENT_REQUIRE(m_.max_ngrams >= 1, "t5.max_ngrams must be >= 1");
  TRIDENT_REQUIRE(m_.geometric_p > 0 && m_.geometric_p <= 1, "t5.geometric_p must be in (0, 1]");
  const std::int64_t max_tokens = encoder_length - 2;
  TRIDENT_REQUIRE(max_tokens >= 2, "the encoder sequence length " << encoder_length << " is too short for T5 samples");
  // The decoder holds [BOS] (input) or [EOS] (target) plus a sentinel and the tokens of every
  // span: spans that would overflow it are not drawn (pick_masked_spans' budget), so it must at
  // least hold one span of one token. With Megatron's T5 shapes (512 / 128) the budget almost
  // never binds: geometric spans average ~3 words, so ~115 of the 127 positions suffice.
  TRIDENT_REQUIRE(decoder_length >= 3, "the decoder sequence length " << decoder_length
                                                                      << " is too short: it must hold [BOS] or [EOS], "
                                                                         "a sentinel and a token (at least 3)");
  index_ = sentence_runs(corpus, doc_begin, doc_end, max_tokens, m_.short_seq_prob, 1, num_samples, seed, name,
                         epochs_);
}

void T5Dataset::get(std::int64_t i, T5Sample& out, std::vector<std::int32_t>* source,
                    std::vector<std::int32_t>* drawn) const {
  const std::int64_t n_index = size();
  const SentenceRun& e = index_[static_cast<size_t>(((i % n_index) + n_index) % n_index)];
  Draws draw{CounterRng(seed_ * 0x9E3779B97F4A7C15ull ^ splitmix64(static_cast<std::uint64_t>(i)) ^ 0x75ull)};
  const auto bounds = corpus_->sentence_bounds(e.doc);
  const std::int64_t n = std::min<std::int64_t>(bounds[e.end] - bounds[e.first], e.target);
  std::vector<std::int32_t> tokens(static_cast<size_t>(n));
  corpus_->read(e.doc, bounds[e.first], n, tokens.data());
  SpanMasking sm;
  sm.prob = m_.masked_prob;
  sm.max_ngrams = m_.max_ngrams;
  sm.geometric = true;
  sm.geometric_p = m_.geometric_p;
  sm.max_cost = dec_len_ - 1;  // the sentinels and the spans' tokens
  sm.cost_per_span = 1;
  sm.max_spans = sp_.num_sentinels;
  const auto spans = pick_masked_spans(tokens.data(), n, continues_, -1, -1, sm, draw, drawn);
  std::vector<std::int32_t> enc, dec = {sp_.bos};
  std::int64_t start = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    const std::int32_t sentinel = sp_.sentinel + static_cast<std::int32_t>(k);
    enc.insert(enc.end(), tokens.begin() + start, tokens.begin() + spans[k].front());
    enc.push_back(sentinel);
    start = spans[k].back() + 1;
    dec.push_back(sentinel);
    for (std::int32_t p : spans[k]) dec.push_back(tokens[static_cast<size_t>(p)]);
  }
  enc.insert(enc.end(), tokens.begin() + start, tokens.end());
  dec.push_back(sp_.eos);  // dec = [BOS] + target; the input drops the last, the target the first
  const auto E = static_cast<size_t>(enc_len_), D = static_cast<size_t>(dec_len_);
  out.num_spans = static_cast<std::int32_t>(spans.size());
  out.enc.assign(E, sp_.pad);
  out.enc_padding.assign(E, 0);
  std::copy(enc.begin(), enc.end(), out.enc.begin());
  std::fill(out.enc_padding.begin(), out.enc_padding.begin() + static_cast<std::ptrdiff_t>(enc.size()), 1);
  const size_t dl = dec.size() - 1;
  out.dec_in.assign(D, sp_.pad);
  out.dec_target.assign(D, -1);
  out.dec_padding.assign(D, 0);
  std::copy(dec.begin(), dec.end() - 1, out.dec_in.begin());
  std::copy(dec.begin() + 1, dec.end(), out.dec_target.begin());
  std::fill(out.dec_padding.begin(), out.dec_padding.begin() + static_cast<std::ptrdiff_t>(dl), 1);
  if (source) *source = std::move(tokens);
}

T5Data::T5Data(const std::string& shard_spec, const std::string& split, std::int64_t encoder_length,
               std::int64_t decoder_length, std::int64_t train_samples, std::int64_t valid_samples, std::uint64_t seed,
               const std::string& vocab_file, const std::string& merges_file, const T5Masking& masking,
               const TokenShardMeta* indexed) {
  MaskingCorpus mc = open_masking_corpus(shard_spec, vocab_file, merges_file, "T5", indexed);
  corpus_ = std::move(mc.corpus);
  specials_ = mc.specials;
  const auto b = split_documents(split, corpus_->num_documents());
  train_ = std::make_unique<T5Dataset>(*corpus_, b[0], b[1], encoder_length, decoder_length, train_samples, seed,
                                       specials_, mc.continues, masking, "train");
  if (valid_samples > 0 && b[2] > b[1])
    valid_ = std::make_unique<T5Dataset>(*corpus_, b[1], b[2], encoder_length, decoder_length, valid_samples, seed,
                                         specials_, mc.continues, masking, "valid");
  std::ostringstream os;
  os << corpus_->num_documents() << " documents (" << b[1] - b[0] << " train, " << b[2] - b[1] << " valid), "
     << train_->size() << " train samples over " << train_->epochs() << " epoch(s), tokenizer " << corpus_->tokenizer()
     << ", " << specials_.num_sentinels << " sentinels";
  description_ = os.str();
}

}  // namespace trident
