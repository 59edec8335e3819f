// The pieces Megatron's BERT and T5 datasets share (megatron/data/dataset_utils.py):
//  - the sample index: runs of consecutive whole sentences of one document reaching a target
//    length (the full length, or with probability short_seq_prob one drawn uniformly from
//    [2, max_tokens]); documents with fewer than min_sentences sentences or with a sentence
//    over 512 tokens are skipped; epochs are added until there are num_samples runs; the index
//    is shuffled;
//  - masked spans (create_masked_lm_predictions): whole words (a token plus the continuation
//    pieces right after it) are the candidates; num_to_predict = max(1, round(n * prob))
//    positions; candidates are visited in random order and each takes an n-gram of words, with
//    P(n) proportional to 1/n over 1..max_ngrams (BERT) or n geometric with parameter p capped
//    at max_ngrams (T5), shrunk while it would exceed num_to_predict, skipped when it overlaps a
//    chosen span.
// Every draw comes from a counter-based stream, so results are pure functions of the seeds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rng.hpp"
#include "data/corpus.hpp"
#include "data/special_tokens.hpp"

namespace trident {

// Sequential draws from a counter-based stream.
struct Draws {
  CounterRng rng;
  std::uint64_t k = 0;
  double uniform() { return rng.uniform_at(k++); }
  std::int64_t below(std::int64_t n) {
    return static_cast<std::int64_t>(rng.below_at(k++, static_cast<std::uint64_t>(n)));
  }
};

struct SentenceRun {
  std::int64_t doc;
  std::int32_t first, end;  // sentences [first, end) of the document
  std::int32_t target;      // target length in tokens
};

constexpr std::int64_t kLongSentence = 512;

// The shuffled sample index of documents [doc_begin, doc_end) (at least num_samples runs);
// epochs receives the number of passes over the documents. name: the dataset's, in messages
// and in the stream keys.
std::vector<SentenceRun> sentence_runs(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end,
                                       std::int64_t max_tokens, double short_seq_prob, int min_sentences,
                                       std::int64_t num_samples, std::uint64_t seed, const std::string& name,
                                       std::int64_t& epochs);

struct SpanMasking {
  double prob = 0.15;
  int max_ngrams = 3;
  bool geometric = false;  // T5: span lengths (in words) geometric with parameter geometric_p
  double geometric_p = 0.2;
  // T5's decoder capacity: the spans' tokens plus cost_per_span each (the sentinel) stay within
  // max_cost (negative: no limit), and at most max_spans spans (negative: no limit). A span
  // that would not fit is shortened like one that passes the masking budget, or skipped.
  std::int64_t max_cost = -1, max_spans = -1;
  int cost_per_span = 0;
};

// The corpus of a BERT or T5 run (data.train_shards without weights; shards with sentences),
// its special tokens (from the shards) and, from the tokenizer files named in the deck, whether
// each vocabulary id continues a word. model names the model in messages.
struct MaskingCorpus {
  std::unique_ptr<Corpus> corpus;
  SpecialTokens specials;
  std::vector<std::uint8_t> continues;  // (vocab_size) 1 when the id continues the word before it
};
MaskingCorpus open_masking_corpus(const std::string& shard_spec, const std::string& vocab_file,
                                  const std::string& merges_file, const char* model,
                                  const TokenShardMeta* indexed = nullptr);

// The masked spans of tokens[0, n): lists of positions, sorted by their first position.
// Tokens equal to skip_a or skip_b (BERT's [CLS] and [SEP]) are never masked; continues[id]
// says whether token id continues the word before it. drawn, when given, receives every span
// length drawn (in words, before the budget shortens it; for statistics).
std::vector<std::vector<std::int32_t>> pick_masked_spans(const std::int32_t* tokens, std::int64_t n,
                                                         const std::vector<std::uint8_t>& continues,
                                                         std::int32_t skip_a, std::int32_t skip_b, const SpanMasking& m,
                                                         Draws& draw, std::vector<std::int32_t>* drawn = nullptr);

}  // namespace trident
