// BERT dataset (layout in bert_dataset.hpp): the sample index (span_masking's sentence runs,
// after checking that the shards hold sentences and BERT's special tokens), sample assembly
// ([CLS] A [SEP] B [SEP] with the random swap and front/back truncation), whole-word n-gram
// masking with the 80/10/10 replacement, and BertData's train/valid datasets over one corpus.
#include "data/bert_dataset.hpp"

#include <algorithm>
#include <sstream>

#include "common/error.hpp"
#include "common/rng.hpp"

namespace trident {

BertDataset::BertDataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t seq_length,
                         std::int64_t num_samples, std::uint64_t seed, const SpecialTokens& specials,
                         std::vector<std::uint8_t> continues_word, const BertMasking& masking, const std::string& name)
    : corpus_(&corpus), seq_length_(seq_length), seed_(seed), sp_(specials), continues_(std::move(continues_word)),
      m_(masking) {
  TRIDENT_REQUIRE(corpus.has_sentences(), name << " dataset: the shards hold no /sentence_offsets (run preprocess_data "
                                                  "with --split-sentences)");
  TRIDENT_REQUIRE(sp_.cls >= 0 && sp_.sep >= 0 && sp_.mask >= 0 && sp_.pad >= 0,
                  name << " dataset: the shards record no [CLS]/[SEP]/[MASK]/[PAD] ids (tokenizer '"
                       << corpus.tokenizer()
                       << "'; use BertWordPieceLowerCase, BertWordPieceCase or GPT2BPEWithBertSpecials)");
  TRIDENT_REQUIRE(static_cast<std::int64_t>(continues_.size()) == corpus.vocab_size(),
                  name << " dataset: the vocabulary has " << continues_.size() << " tokens, the shards "
                       << corpus.vocab_size());
  TRIDENT_REQUIRE(m_.masked_lm_prob > 0 && m_.masked_lm_prob < 1,
                  "deck: bert.mask_prob = " << m_.masked_lm_prob << " must lie in (0, 1)");
  TRIDENT_REQUIRE(m_.short_seq_prob >= 0 && m_.short_seq_prob <= 1, "bert.short_seq_prob must be in [0, 1]");
  TRIDENT_REQUIRE(m_.max_ngrams >= 1, "bert.max_ngrams must be >= 1");
  const std::int64_t max_tokens = seq_length - (m_.binary_head ? 3 : 2);
  TRIDENT_REQUIRE(max_tokens >= 2, "model.seq_length " << seq_length << " is too short for BERT samples");
  const int min_sentences = m_.binary_head ? 2 : 1;

  index_ = sentence_runs(corpus, doc_begin, doc_end, max_tokens, m_.short_seq_prob, min_sentences, num_samples, seed,
                         name, epochs_);
}

void BertDataset::get(std::int64_t i, BertSample& out) const {
  const std::int64_t n_index = size();
  const SentenceRun& e = index_[static_cast<size_t>(((i % n_index) + n_index) % n_index)];
  Draws draw{CounterRng(seed_ * 0x9E3779B97F4A7C15ull ^ splitmix64(static_cast<std::uint64_t>(i)))};
  const auto bounds = corpus_->sentence_bounds(e.doc);
  std::vector<std::int32_t> text(static_cast<size_t>(bounds[e.end] - bounds[e.first]));
  corpus_->read(e.doc, bounds[e.first], static_cast<std::int64_t>(text.size()), text.data());
  auto span = [&](int s0, int s1) {  // tokens of sentences [s0, s1) of the entry
    return std::vector<std::int32_t>(text.begin() + (bounds[e.first + s0] - bounds[e.first]),
                                     text.begin() + (bounds[e.first + s1] - bounds[e.first]));
  };
  const int n = e.end - e.first;
  std::vector<std::int32_t> a, b;
  out.is_random = 0;
  if (m_.binary_head) {
    const int a_end = n >= 3 ? static_cast<int>(1 + draw.below(n - 1)) : 1;
    a = span(0, a_end);
    b = span(a_end, n);
    if (draw.uniform() < 0.5) {
      std::swap(a, b);
      out.is_random = 1;
    }
  } else {
    a = span(0, n);
  }
  while (static_cast<std::int64_t>(a.size() + b.size()) > e.target) {
    auto& t = a.size() > b.size() ? a : b;
    if (draw.uniform() < 0.5)
      t.erase(t.begin());
    else
      t.pop_back();
  }
  // [CLS] A [SEP] B [SEP]
  std::vector<std::int32_t> tok, typ;
  tok.push_back(sp_.cls);
  typ.push_back(0);
  for (auto t : a) tok.push_back(t), typ.push_back(0);
  tok.push_back(sp_.sep);
  typ.push_back(0);
  if (m_.binary_head) {
    for (auto t : b) tok.push_back(t), typ.push_back(1);
    tok.push_back(sp_.sep);
    typ.push_back(1);
  }
  const auto len = static_cast<std::int64_t>(tok.size());

  SpanMasking sm;
  sm.prob = m_.masked_lm_prob;
  sm.max_ngrams = m_.max_ngrams;
  out.labels.assign(static_cast<size_t>(seq_length_), -1);
  for (const auto& span : pick_masked_spans(tok.data(), len, continues_, sp_.cls, sp_.sep, sm, draw))
    for (std::int32_t p : span) {
      out.labels[static_cast<size_t>(p)] = tok[static_cast<size_t>(p)];
      if (draw.uniform() < 0.8)
        tok[static_cast<size_t>(p)] = sp_.mask;
      else if (draw.uniform() >= 0.5)
        tok[static_cast<size_t>(p)] = static_cast<std::int32_t>(
            draw.below(static_cast<std::int64_t>(continues_.size())));
    }
  out.tokens.assign(static_cast<size_t>(seq_length_), sp_.pad);
  out.types.assign(static_cast<size_t>(seq_length_), 0);
  out.padding.assign(static_cast<size_t>(seq_length_), 0);
  std::copy(tok.begin(), tok.end(), out.tokens.begin());
  std::copy(typ.begin(), typ.end(), out.types.begin());
  std::fill(out.padding.begin(), out.padding.begin() + len, 1);
}

BertData::BertData(const std::string& shard_spec, const std::string& split, std::int64_t seq_length,
                   std::int64_t train_samples, std::int64_t valid_samples, std::uint64_t seed,
                   const std::string& vocab_file, const std::string& merges_file, const BertMasking& masking,
                   const TokenShardMeta* indexed) {
  MaskingCorpus mc = open_masking_corpus(shard_spec, vocab_file, merges_file, "BERT", indexed);
  corpus_ = std::move(mc.corpus);
  specials_ = mc.specials;
  const std::vector<std::uint8_t>& cont = mc.continues;
  const auto b = split_documents(split, corpus_->num_documents());
  train_ = std::make_unique<BertDataset>(*corpus_, b[0], b[1], seq_length, train_samples, seed, specials_, cont,
                                         masking, "train");
  if (valid_samples > 0 && b[2] > b[1])
    valid_ = std::make_unique<BertDataset>(*corpus_, b[1], b[2], seq_length, valid_samples, seed, specials_, cont,
                                           masking, "valid");
  std::ostringstream os;
  os << corpus_->num_documents() << " documents (" << b[1] - b[0] << " train, " << b[2] - b[1] << " valid), "
     << train_->size() << " train samples over " << train_->epochs() << " epoch(s), tokenizer " << corpus_->tokenizer();
  description_ = os.str();
}

}  // namespace trident
