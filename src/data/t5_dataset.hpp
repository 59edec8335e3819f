// T5 dataset as Megatron builds it (megatron/data/t5_dataset.py, span corruption):
//  - sample index (data/span_masking): runs of consecutive sentences of one document reaching
//    the target length encoder_length - 2 (shorter with probability short_seq_prob); the
//    tokens of the run are concatenated and truncated to the target length;
//  - spans (data/span_masking): whole words, span lengths in words geometric with p = 0.2 and
//    capped at max_ngrams = 10, about masked_prob = 0.15 of the tokens; spans whose sentinel
//    and tokens would overflow the decoder (or would need more sentinels than the vocabulary
//    has) are shortened or not drawn, so every sample fits (Megatron asserts instead);
//  - encoder input: the tokens with span k replaced by the sentinel <extra_id_k>;
//    decoder input: [BOS] <extra_id_0> span 0 <extra_id_1> span 1 ...;
//    decoder target: <extra_id_0> span 0 <extra_id_1> span 1 ... [EOS] (the decoder input
//    shifted by one); encoder and decoder padded to their own lengths with [PAD], padding masks
//    1 for real tokens, target -1 at padding.
// Every random choice is drawn from a counter-based stream keyed by (seed, sample index).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/span_masking.hpp"

namespace trident {

struct T5Masking {
  double masked_prob = 0.15;
  double short_seq_prob = 0.1;
  int max_ngrams = 10;
  double geometric_p = 0.2;
};

struct T5Sample {
  std::vector<std::int32_t> enc, enc_padding;                 // encoder_length each
  std::vector<std::int32_t> dec_in, dec_target, dec_padding;  // decoder_length each
  std::int32_t num_spans = 0;
};

class T5Dataset {
 public:
  // Documents [doc_begin, doc_end) of corpus (with sentences); at least num_samples samples.
  // specials: pad, bos, eos and the sentinels are required (preprocess_data --vocab-extra-ids).
  T5Dataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t encoder_length,
            std::int64_t decoder_length, std::int64_t num_samples, std::uint64_t seed, const SpecialTokens& specials,
            std::vector<std::uint8_t> continues_word, const T5Masking& masking, const std::string& name);

  std::int64_t size() const { return static_cast<std::int64_t>(index_.size()); }
  std::int64_t epochs() const { return epochs_; }
  // Sample i (modulo size()); source, when given, receives the unmasked, truncated tokens, and
  // drawn the span lengths drawn (words, before the budget; see pick_masked_spans).
  void get(std::int64_t i, T5Sample& out, std::vector<std::int32_t>* source = nullptr,
           std::vector<std::int32_t>* drawn = nullptr) const;

 private:
  const Corpus* corpus_;
  std::int64_t enc_len_, dec_len_, epochs_ = 0;
  std::uint64_t seed_;
  SpecialTokens sp_;
  std::vector<std::uint8_t> continues_;  // (vocab_size) 1 when the id continues the word before it
  T5Masking m_;
  std::vector<SentenceRun> index_;
};

// The train and valid T5 datasets of data.train_shards (one corpus, shards with sentences and
// T5's special tokens; the vocabulary file gives the word boundaries).
class T5Data {
 public:
  T5Data(const std::string& shard_spec, const std::string& split, std::int64_t encoder_length,
         std::int64_t decoder_length, std::int64_t train_samples, std::int64_t valid_samples, std::uint64_t seed,
         const std::string& vocab_file, const std::string& merges_file, const T5Masking& masking,
         const TokenShardMeta* indexed = nullptr);
  const T5Dataset& train() const { return *train_; }
  const T5Dataset* valid() const { return valid_.get(); }
  std::int64_t vocab_size() const { return corpus_->vocab_size(); }
  const SpecialTokens& specials() const { return specials_; }
  std::string describe() const { return description_; }

 private:
  std::unique_ptr<Corpus> corpus_;
  std::unique_ptr<T5Dataset> train_, valid_;
  SpecialTokens specials_;
  std::string description_;
};

}  // namespace trident
