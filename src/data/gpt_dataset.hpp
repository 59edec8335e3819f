// GPT dataset as Megatron builds it: the documents of one split are shuffled per epoch and
// concatenated; sample i is the window of seq_length + 1 tokens starting at token
// i * seq_length of that stream (consecutive windows share one token), and samples are served
// in a shuffled order. Everything is a pure function of (seed, documents, seq_length), so a run
// resumes exactly from a consumed-samples count. Only the index lives in memory; tokens are
// read from the shards per sample.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/corpus.hpp"
#include "data/index_cache.hpp"

namespace trident {

class GptDataset {
 public:
  // Documents [doc_begin, doc_end) of corpus; at least num_samples samples (more epochs as needed).
  // cache_dir: where the index (document order, document starts, sample order) is cached and
  // mapped from (data/index_cache.hpp); "" keeps it in memory.
  GptDataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t seq_length,
             std::int64_t num_samples, std::uint64_t seed, const std::string& name, bool shuffle = true,
             const std::string& cache_dir = "");

  std::int64_t size() const { return num_samples_; }
  std::int64_t epochs() const { return epochs_; }
  // Writes seq_length + 1 tokens of sample i (i taken modulo size()).
  void get(std::int64_t i, std::int32_t* out) const;
  // Every input the index depends on (the cache key).
  const std::string& key() const { return key_; }
  const std::string& index_origin() const { return index_.origin(); }

 private:
  const Corpus* corpus_;
  std::int64_t seq_length_, num_samples_ = 0, epochs_ = 0, doc_begin_ = 0, doc_end_ = 0;
  std::string key_, where_;
  // 0: document of each stream position (epochs x docs); 1: stream token offset where each
  // starts (+ the end); 2: (num_samples) sample order
  CachedIndex index_;
};

// Megatron's blending: sample i goes to the dataset whose realised share lags its weight most.
// The assignment (2 x 8 bytes per sample) is cached like the datasets' indices.
class BlendedDataset {
 public:
  BlendedDataset(std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
                 std::int64_t num_samples, const std::string& cache_dir = "");
  std::int64_t size() const { return index_.size(0); }
  void get(std::int64_t i, std::int32_t* out) const;
  const std::string& index_origin() const { return index_.origin(); }

 private:
  std::vector<std::unique_ptr<GptDataset>> datasets_;
  std::string where_;
  CachedIndex index_;  // 0: dataset of each blended sample; 1: its sample index in that dataset
};

// Builds the train and valid datasets of data.train_shards for a run. Owns the corpora.
class GptData {
 public:
  GptData(const std::string& shard_spec, const std::string& split, std::int64_t seq_length, std::int64_t train_samples,
          std::int64_t valid_samples, std::uint64_t seed,
          const TokenShardMeta* indexed = nullptr,   // Megatron pairs' tokenizer (Corpus)
          const std::string& index_cache = "none");  // data.index_cache (index_cache_dir)
  const BlendedDataset& train() const { return *train_; }
  const BlendedDataset* valid() const { return valid_.get(); }
  std::int64_t vocab_size() const { return vocab_size_; }
  // the corpora's end-of-document id (every corpus records the same; -1: none)
  std::int64_t eod_id() const { return eod_id_; }
  std::string describe() const { return description_; }

 private:
  std::vector<std::unique_ptr<Corpus>> corpora_;
  std::unique_ptr<BlendedDataset> train_, valid_;
  std::int64_t vocab_size_ = 0, eod_id_ = -1;
  std::string description_;
};

}  // namespace trident
