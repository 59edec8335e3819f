// BERT dataset: sample index, sentence pairs, truncation and whole-word n-gram masking.
#include "data/bert_dataset.hpp"

#include <algorithm>
#include <sstream>

#include "common/error.hpp"
#include "common/rng.hpp"

namespace trident {

namespace {

// Sequential draws from a counter-based stream.
struct Draws {
  CounterRng rng;
  std::uint64_t k = 0;
  double uniform() { return rng.uniform_at(k++); }
  std::int64_t below(std::int64_t n) { return static_cast<std::int64_t>(rng.below_at(k++, static_cast<std::uint64_t>(n))); }
};

}  // namespace

BertDataset::BertDataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t seq_length,
                         std::int64_t num_samples, std::uint64_t seed, const SpecialTokens& specials,
                         std::vector<std::uint8_t> continues_word, const BertMasking& masking, const std::string& name)
    : corpus_(&corpus), seq_length_(seq_length), seed_(seed), sp_(specials), continues_(std::move(continues_word)),
      m_(masking) {
  TRIDENT_REQUIRE(corpus.has_sentences(), name << " dataset: the shards hold no /sentence_offsets (run preprocess_data "
                                                  "with --split-sentences)");
  TRIDENT_REQUIRE(sp_.cls >= 0 && sp_.sep >= 0 && sp_.mask >= 0 && sp_.pad >= 0,
                  name << " dataset: the shards record no [CLS]/[SEP]/[MASK]/[PAD] ids (tokenizer '" << corpus.tokenizer()
                       << "'; use BertWordPieceLowerCase, BertWordPieceCase or GPT2BPEWithBertSpecials)");
  TRIDENT_REQUIRE(static_cast<std::int64_t>(continues_.size()) == corpus.vocab_size(),
                  name << " dataset: the vocabulary has " << continues_.size() << " tokens, the shards "
                       << corpus.vocab_size());
  TRIDENT_REQUIRE(m_.masked_lm_prob > 0 && m_.masked_lm_prob < 1, "bert.masked_lm_prob must be in (0, 1)");
  TRIDENT_REQUIRE(m_.short_seq_prob >= 0 && m_.short_seq_prob <= 1, "bert.short_seq_prob must be in [0, 1]");
  TRIDENT_REQUIRE(m_.max_ngrams >= 1, "bert.max_ngrams must be >= 1");
  const std::int64_t max_tokens = seq_length - (m_.binary_head ? 3 : 2);
  TRIDENT_REQUIRE(max_tokens >= 2, "model.seq_length " << seq_length << " is too short for BERT samples");
  const int min_sentences = m_.binary_head ? 2 : 1;

  // eligible documents and their sentence lengths
  struct Doc {
    std::int64_t d;
    std::vector<std::int64_t> len;
  };
  std::vector<Doc> docs;
  for (std::int64_t d = doc_begin; d < doc_end; ++d) {
    const auto b = corpus.sentence_bounds(d);
    Doc doc{d, {}};
    bool long_sentence = false;
    for (size_t s = 0; s + 1 < b.size(); ++s) {
      doc.len.push_back(b[s + 1] - b[s]);
      long_sentence = long_sentence || doc.len.back() > kLongSentence;
    }
    if (static_cast<int>(doc.len.size()) >= min_sentences && !long_sentence) docs.push_back(std::move(doc));
  }
  TRIDENT_REQUIRE(!docs.empty(), name << " dataset: no document of the split has " << min_sentences
                                      << " sentences of at most " << kLongSentence << " tokens");
  Draws draw{CounterRng(seed ^ hash_string(name + "/bert-index"))};
  auto target = [&]() -> std::int32_t {
    if (draw.uniform() < m_.short_seq_prob) return static_cast<std::int32_t>(2 + draw.below(max_tokens - 1));
    return static_cast<std::int32_t>(max_tokens);
  };
  while (static_cast<std::int64_t>(index_.size()) < num_samples) {
    for (const Doc& doc : docs) {
      const int n = static_cast<int>(doc.len.size());
      int first = 0, count = 0;
      std::int64_t len = 0;
      std::int32_t tgt = target();
      for (int s = 0; s < n; ++s) {
        len += doc.len[s];
        ++count;
        const int remain = n - s - 1;
        if ((len >= tgt && remain > 1 && count >= min_sentences) || remain == 0) {
          if (count >= min_sentences) index_.push_back({doc.d, first, s + 1, tgt});
          first = s + 1;
          len = 0;
          count = 0;
          tgt = target();
        }
      }
    }
    ++epochs_;
  }
  // shuffle (Fisher-Yates)
  Draws shuffle{CounterRng(seed ^ hash_string(name + "/bert-shuffle"))};
  for (std::int64_t i = static_cast<std::int64_t>(index_.size()) - 1; i > 0; --i)
    std::swap(index_[static_cast<size_t>(i)], index_[static_cast<size_t>(shuffle.below(i + 1))]);
}

void BertDataset::get(std::int64_t i, BertSample& out) const {
  const std::int64_t n_index = size();
  const Entry& e = index_[static_cast<size_t>(((i % n_index) + n_index) % n_index)];
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

  // whole words: a token plus the continuation pieces right after it
  std::vector<std::vector<std::int32_t>> words;
  for (std::int32_t p = 0; p < static_cast<std::int32_t>(len); ++p) {
    const std::int32_t t = tok[static_cast<size_t>(p)];
    if (t == sp_.cls || t == sp_.sep) continue;
    if (!words.empty() && continues_[static_cast<size_t>(t)] && words.back().back() == p - 1)
      words.back().push_back(p);
    else
      words.push_back({p});
  }
  const auto num_to_predict =
      std::max<std::int64_t>(1, std::llround(static_cast<double>(len) * m_.masked_lm_prob));
  std::vector<std::int32_t> order(words.size());
  for (size_t w = 0; w < order.size(); ++w) order[w] = static_cast<std::int32_t>(w);
  for (std::int64_t w = static_cast<std::int64_t>(order.size()) - 1; w > 0; --w)
    std::swap(order[static_cast<size_t>(w)], order[static_cast<size_t>(draw.below(w + 1))]);
  std::vector<std::uint8_t> covered(static_cast<size_t>(len), 0);
  out.labels.assign(static_cast<size_t>(seq_length_), -1);
  std::int64_t masked = 0;
  const auto W = static_cast<std::int64_t>(words.size());
  for (std::int32_t w : order) {
    if (masked >= num_to_predict) break;
    const int avail = static_cast<int>(std::min<std::int64_t>(m_.max_ngrams, W - w));
    // n with P(n) proportional to 1/n over 1..avail
    double total = 0;
    for (int k = 1; k <= avail; ++k) total += 1.0 / k;
    double u = draw.uniform() * total;
    int ngram = avail;
    for (int k = 1; k <= avail; ++k) {
      u -= 1.0 / k;
      if (u < 0) {
        ngram = k;
        break;
      }
    }
    auto positions = [&](int k) {
      std::vector<std::int32_t> p;
      for (int j = 0; j < k; ++j) p.insert(p.end(), words[static_cast<size_t>(w + j)].begin(), words[static_cast<size_t>(w + j)].end());
      return p;
    };
    std::vector<std::int32_t> pos = positions(ngram);
    while (masked + static_cast<std::int64_t>(pos.size()) > num_to_predict && ngram > 1) pos = positions(--ngram);
    if (masked + static_cast<std::int64_t>(pos.size()) > num_to_predict) continue;
    if (std::any_of(pos.begin(), pos.end(), [&](std::int32_t p) { return covered[static_cast<size_t>(p)] != 0; }))
      continue;
    for (std::int32_t p : pos) {
      covered[static_cast<size_t>(p)] = 1;
      out.labels[static_cast<size_t>(p)] = tok[static_cast<size_t>(p)];
      if (draw.uniform() < 0.8)
        tok[static_cast<size_t>(p)] = sp_.mask;
      else if (draw.uniform() >= 0.5)
        tok[static_cast<size_t>(p)] = static_cast<std::int32_t>(draw.below(static_cast<std::int64_t>(continues_.size())));
      ++masked;
    }
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
                   const std::string& vocab_file, const std::string& merges_file, const BertMasking& masking) {
  const auto spec = parse_shard_spec(shard_spec);
  TRIDENT_REQUIRE(spec.size() == 1, "data.train_shards: weighted blending is not supported for BERT yet; "
                                    "list the shards without weights");
  corpus_ = std::make_unique<Corpus>(spec[0].paths);
  const TokenShardMeta& meta = corpus_->meta();
  specials_ = meta.specials;
  specials_.eod = static_cast<std::int32_t>(meta.eod_id);
  TRIDENT_REQUIRE(corpus_->has_sentences(), "data.train_shards: the shards hold no /sentence_offsets (run "
                                            "preprocess_data with --split-sentences for BERT)");
  TRIDENT_REQUIRE(!vocab_file.empty(), "data.vocab_file is required for BERT (the " << corpus_->tokenizer()
                                                                                  << " vocabulary of the shards: "
                                                                                     "whole-word masking needs it)");
  const auto tok = make_tokenizer(corpus_->tokenizer(), vocab_file, merges_file, meta.specials.num_sentinels);
  TRIDENT_REQUIRE(tok->vocab_size() == corpus_->vocab_size(),
                  "data.vocab_file '" << vocab_file << "' has " << tok->vocab_size() << " tokens, the shards' "
                                      << corpus_->tokenizer() << " vocabulary " << corpus_->vocab_size());
  std::vector<std::uint8_t> cont(static_cast<size_t>(tok->vocab_size()));
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(cont.size()); ++id) cont[static_cast<size_t>(id)] = tok->continues_word(id);
  const auto b = split_documents(split, corpus_->num_documents());
  train_ = std::make_unique<BertDataset>(*corpus_, b[0], b[1], seq_length, train_samples, seed, specials_, cont, masking,
                                         "train");
  if (valid_samples > 0 && b[2] > b[1])
    valid_ = std::make_unique<BertDataset>(*corpus_, b[1], b[2], seq_length, valid_samples, seed, specials_, cont,
                                           masking, "valid");
  std::ostringstream os;
  os << corpus_->num_documents() << " documents (" << b[1] - b[0] << " train, " << b[2] - b[1] << " valid), "
     << train_->size() << " train samples over " << train_->epochs() << " epoch(s), tokenizer "
     << corpus_->tokenizer();
  description_ = os.str();
}

}  // namespace trident
