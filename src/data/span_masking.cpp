// Sample index and masked spans shared by the BERT and T5 datasets (rules in span_masking.hpp):
// sentence_runs (documents filtered, runs cut at drawn target lengths, epoch after epoch, then a
// Fisher-Yates shuffle), open_masking_corpus (the unweighted corpus, its special tokens and the
// per-id word-continuation table from the tokenizer) and pick_masked_spans.
#include "data/span_masking.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "data/tokenizer.hpp"

namespace trident {

std::vector<SentenceRun> sentence_runs(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end,
                                       std::int64_t max_tokens, double short_seq_prob, int min_sentences,
                                       std::int64_t num_samples, std::uint64_t seed, const std::string& name,
                                       std::int64_t& epochs) {
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
                                      << " sentence(s) of at most " << kLongSentence << " tokens");
  Draws draw{CounterRng(seed ^ hash_string(name + "/bert-index"))};
  auto target = [&]() -> std::int32_t {
    if (draw.uniform() < short_seq_prob) return static_cast<std::int32_t>(2 + draw.below(max_tokens - 1));
    return static_cast<std::int32_t>(max_tokens);
  };
  std::vector<SentenceRun> index;
  epochs = 0;
  while (static_cast<std::int64_t>(index.size()) < num_samples) {
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
          if (count >= min_sentences) index.push_back({doc.d, first, s + 1, tgt});
          first = s + 1;
          len = 0;
          count = 0;
          tgt = target();
        }
      }
    }
    ++epochs;
  }
  Draws shuffle{CounterRng(seed ^ hash_string(name + "/bert-shuffle"))};  // Fisher-Yates
  for (std::int64_t i = static_cast<std::int64_t>(index.size()) - 1; i > 0; --i)
    std::swap(index[static_cast<size_t>(i)], index[static_cast<size_t>(shuffle.below(i + 1))]);
  return index;
}

MaskingCorpus open_masking_corpus(const std::string& shard_spec, const std::string& vocab_file,
                                  const std::string& merges_file, const char* model, const TokenShardMeta* indexed) {
  const auto spec = parse_shard_spec(shard_spec);
  TRIDENT_REQUIRE(spec.size() == 1, "data.train_shards: weighted blending is not supported for "
                                        << model << " yet; list the shards without weights");
  MaskingCorpus out;
  out.corpus = std::make_unique<Corpus>(spec[0].paths, indexed);
  const Corpus& c = *out.corpus;
  out.specials = c.meta().specials;
  out.specials.eod = static_cast<std::int32_t>(c.meta().eod_id);
  TRIDENT_REQUIRE(c.has_sentences(),
                  "data.train_shards: the shards hold no /sentence_offsets (run preprocess_data "
                  "with --split-sentences for "
                      << model << ")");
  TRIDENT_REQUIRE(!vocab_file.empty(), "data.vocab_file is required for " << model << " (the " << c.tokenizer()
                                                                          << " vocabulary of the shards: "
                                                                             "whole-word masking needs it)");
  const auto tok = make_tokenizer(c.tokenizer(), vocab_file, merges_file, out.specials.num_sentinels);
  TRIDENT_REQUIRE(tok->vocab_size() == c.vocab_size(),
                  "data.vocab_file '" << vocab_file << "' has " << tok->vocab_size() << " tokens, the shards' "
                                      << c.tokenizer() << " vocabulary " << c.vocab_size());
  out.continues.resize(static_cast<size_t>(tok->vocab_size()));
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(out.continues.size()); ++id)
    out.continues[static_cast<size_t>(id)] = tok->continues_word(id);
  return out;
}

std::vector<std::vector<std::int32_t>> pick_masked_spans(const std::int32_t* tokens, std::int64_t n,
                                                         const std::vector<std::uint8_t>& continues,
                                                         std::int32_t skip_a, std::int32_t skip_b, const SpanMasking& m,
                                                         Draws& draw, std::vector<std::int32_t>* drawn) {
  // whole words: a token plus the continuation pieces right after it
  std::vector<std::vector<std::int32_t>> words;
  for (std::int32_t p = 0; p < static_cast<std::int32_t>(n); ++p) {
    const std::int32_t t = tokens[p];
    if (t == skip_a || t == skip_b) continue;
    if (!words.empty() && continues[static_cast<size_t>(t)] && words.back().back() == p - 1)
      words.back().push_back(p);
    else
      words.push_back({p});
  }
  const auto num_to_predict = std::max<std::int64_t>(1, std::llround(static_cast<double>(n) * m.prob));
  std::vector<std::int32_t> order(words.size());
  for (size_t w = 0; w < order.size(); ++w) order[w] = static_cast<std::int32_t>(w);
  for (std::int64_t w = static_cast<std::int64_t>(order.size()) - 1; w > 0; --w)
    std::swap(order[static_cast<size_t>(w)], order[static_cast<size_t>(draw.below(w + 1))]);
  std::vector<std::uint8_t> covered(static_cast<size_t>(n), 0);
  std::vector<std::vector<std::int32_t>> spans;
  std::int64_t masked = 0, cost = 0;
  const auto W = static_cast<std::int64_t>(words.size());
  for (std::int32_t w : order) {
    if (masked >= num_to_predict) break;
    const int avail = static_cast<int>(std::min<std::int64_t>(m.max_ngrams, W - w));
    int ngram = avail;
    if (m.geometric) {  // number of Bernoulli(p) trials up to the first success, capped
      const double u = draw.uniform();
      const double g = 1.0 + std::floor(std::log1p(-u) / std::log1p(-m.geometric_p));
      if (drawn) drawn->push_back(static_cast<std::int32_t>(std::min<double>(g, m.max_ngrams)));
      ngram = static_cast<int>(std::min<double>(g, avail));
    } else {  // P(n) proportional to 1/n over 1..avail
      double total = 0;
      for (int k = 1; k <= avail; ++k) total += 1.0 / k;
      double u = draw.uniform() * total;
      for (int k = 1; k <= avail; ++k) {
        u -= 1.0 / k;
        if (u < 0) {
          ngram = k;
          break;
        }
      }
      if (drawn) drawn->push_back(ngram);
    }
    auto positions = [&](int k) {
      std::vector<std::int32_t> p;
      for (int j = 0; j < k; ++j)
        p.insert(p.end(), words[static_cast<size_t>(w + j)].begin(), words[static_cast<size_t>(w + j)].end());
      return p;
    };
    if (m.max_spans >= 0 && static_cast<std::int64_t>(spans.size()) >= m.max_spans) break;
    auto too_long = [&](const std::vector<std::int32_t>& p) {
      const auto len = static_cast<std::int64_t>(p.size());
      return masked + len > num_to_predict || (m.max_cost >= 0 && cost + len + m.cost_per_span > m.max_cost);
    };
    std::vector<std::int32_t> pos = positions(ngram);
    while (too_long(pos) && ngram > 1) pos = positions(--ngram);
    if (too_long(pos)) continue;
    if (std::any_of(pos.begin(), pos.end(), [&](std::int32_t p) { return covered[static_cast<size_t>(p)] != 0; }))
      continue;
    for (std::int32_t p : pos) covered[static_cast<size_t>(p)] = 1;
    masked += static_cast<std::int64_t>(pos.size());
    cost += static_cast<std::int64_t>(pos.size()) + m.cost_per_span;
    spans.push_back(std::move(pos));
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return spans;
}

}  // namespace trident
