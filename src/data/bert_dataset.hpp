// BERT dataset as Megatron builds it (megatron/data/bert_dataset.py, dataset_utils.py):
//  - sample index (data/span_masking): runs of consecutive sentences of one document reaching
//    the target length seq_length - 3 (shorter with probability short_seq_prob), documents of
//    at least 2 sentences (binary head), shuffled.
//  - a sample: [CLS] A [SEP] B [SEP]; A is the first k sentences (k uniform in [1, n - 1] for
//    n >= 3 sentences, 1 for n = 2), B the rest; with probability 1/2 A and B are swapped
//    (the sentence-order label is_random = 1). The pair is truncated to the target length by
//    dropping tokens from the longer segment, from its front or back with probability 1/2.
//    Token types: 0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding.
//  - masking: whole words (a word is a token plus the continuation pieces after it) are the
//    candidates; num_to_predict = max(1, round(len * masked_lm_prob)) positions of the len
//    tokens (special tokens never); candidates are visited in random order and each takes an
//    n-gram of n <= max_ngrams words with P(n) proportional to 1/n (shrunk when it would
//    exceed num_to_predict, skipped when it overlaps masked words); each masked position
//    becomes [MASK] with probability 0.8, else itself with 0.5, else a token uniform over the
//    vocabulary. labels hold the original token at masked positions, -1 elsewhere.
// Every random choice is drawn from a counter-based stream keyed by (seed, sample index), so
// sample i is the same on every rank, for every layout and after a resume.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/corpus.hpp"
#include "data/span_masking.hpp"
#include "data/tokenizer.hpp"

namespace trident {

struct BertMasking {
  double masked_lm_prob = 0.15;
  double short_seq_prob = 0.1;
  int max_ngrams = 3;
  bool binary_head = true;  // sentence pairs and the sentence-order label (else one segment)
};

// One training sample, seq_length positions each.
struct BertSample {
  std::vector<std::int32_t> tokens, types, labels, padding;  // padding: 1 real token, 0 pad
  std::int32_t is_random = 0;                                // sentence-order label
};

class BertDataset {
 public:
  // Documents [doc_begin, doc_end) of corpus (with sentences); at least num_samples samples.
  // continues_word: per vocabulary id, whether the token continues the previous one's word.
  BertDataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t seq_length,
              std::int64_t num_samples, std::uint64_t seed, const SpecialTokens& specials,
              std::vector<std::uint8_t> continues_word, const BertMasking& masking, const std::string& name);

  std::int64_t size() const { return static_cast<std::int64_t>(index_.size()); }
  std::int64_t epochs() const { return epochs_; }
  // Sample i (modulo size()).
  void get(std::int64_t i, BertSample& out) const;

 private:
  const Corpus* corpus_;
  std::int64_t seq_length_, epochs_ = 0;
  std::uint64_t seed_;
  SpecialTokens sp_;
  std::vector<std::uint8_t> continues_;  // (vocab_size) 1 when the id continues the word before it
  BertMasking m_;
  std::vector<SentenceRun> index_;
};

// The train and valid BERT datasets of data.train_shards (one corpus; blending is GPT's only
// for now). The shards must hold sentences and special-token ids; the vocabulary file gives
// the word boundaries for whole-word masking.
class BertData {
 public:
  BertData(const std::string& shard_spec, const std::string& split, std::int64_t seq_length, std::int64_t train_samples,
           std::int64_t valid_samples, std::uint64_t seed, const std::string& vocab_file,
           const std::string& merges_file, const BertMasking& masking, const TokenShardMeta* indexed = nullptr);
  const BertDataset& train() const { return *train_; }
  const BertDataset* valid() const { return valid_.get(); }
  std::int64_t vocab_size() const { return corpus_->vocab_size(); }
  const SpecialTokens& specials() const { return specials_; }
  std::string describe() const { return description_; }

 private:
  std::unique_ptr<Corpus> corpus_;
  std::unique_ptr<BertDataset> train_, valid_;
  SpecialTokens specials_;
  std::string description_;
};

}  // namespace trident
