// Corpus: an ordered set of token shards seen as one list of documents. Shard metadata and
// document offsets are held in memory; tokens are streamed from the files on demand.
// data.train_shards takes files or globs, each optionally preceded by a weight (Megatron's
// --data-path form). Without weights all files form one corpus; with weights each
// (weight, glob) pair is a corpus and the corpora are blended.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "data/token_shard.hpp"
#include "io/mapped_file.hpp"

namespace trident {

struct WeightedPaths {
  double weight = 1.0;
  std::vector<std::string> paths;  // sorted glob expansion
};

// Parses "a.h5 b_*.h5" or "0.3 a_*.h5 0.7 b.h5". Globs that match nothing are errors. A Megatron
// indexed dataset is named by its prefix (P for P.bin + P.idx) or by either file; a glob's
// matches of P.bin and P.idx count once, as P.
std::vector<WeightedPaths> parse_shard_spec(const std::string& spec);

// What the deck says about the tokenizer of Megatron indexed datasets (data.tokenizer_type,
// data.vocab_file, data.merges_file, data.vocab_extra_ids, data.tokenizer_model): the tokenizer's name, vocabulary
// size, end-of-document and special-token ids, as a TokenShardMeta. Empty type: none (nullopt).
std::optional<TokenShardMeta> indexed_dataset_description(const std::string& type, const std::string& vocab_file,
                                                          const std::string& merges_file, int extra_ids,
                                                          const std::string& model = "");

class Corpus {
 public:
  // paths: HDF5 shards and Megatron pairs (prefixes), in order; `indexed` describes the pairs'
  // tokenizer (TokenShardReader).
  explicit Corpus(const std::vector<std::string>& paths, const TokenShardMeta* indexed = nullptr);

  std::int64_t num_documents() const { return num_docs_; }
  std::int64_t document_length(std::int64_t d) const;
  // Reads tokens [offset, offset + count) of document d into out (count).
  void read(std::int64_t d, std::int64_t offset, std::int64_t count, std::int32_t* out) const;
  std::int64_t vocab_size() const { return vocab_size_; }
  std::int64_t eod_id() const { return eod_id_; }
  const std::string& tokenizer() const { return tokenizer_; }
  // Sentence boundaries of document d relative to its start (first 0, last its length); empty
  // when the shards hold no /sentence_offsets (has_sentences() false).
  std::vector<std::int64_t> sentence_bounds(std::int64_t d) const;
  bool has_sentences() const { return has_sentences_; }
  // The special tokens recorded in the shards (cls, sep, mask, pad; -1 when absent).
  const TokenShardMeta& meta() const { return shards_.front().meta(); }
  std::int64_t num_tokens() const { return num_tokens_; }
  const std::vector<TokenShardReader>& shards() const { return shards_; }
  // "path:size:mtime" of every shard (for keys of derived caches).
  std::string identity() const;

  // f() over the mapped offsets; a mapped file that shrank becomes an error naming the shard.
  template <class F>
  decltype(auto) guarded(F&& f) const {
    try {
      return guarded_map_read(where_, std::forward<F>(f));
    } catch (const Error&) {
      throw Error::all(changed_message());
    }
  }

 private:
  // shard and index within it of document d
  std::pair<std::size_t, std::int64_t> locate(std::int64_t d) const;
  std::string changed_message() const;

  // The documents are the shards' non-empty documents in order. Offsets stay in the shards'
  // mappings: per document only an entry of nonempty_ when some document is empty.
  std::vector<TokenShardReader> shards_;
  std::vector<std::int64_t> shard_first_;  // (shards + 1) first raw document of each shard
  std::vector<std::int64_t> nonempty_;     // raw index of each document; empty: all non-empty
  std::int64_t num_docs_ = 0;
  std::int64_t vocab_size_ = 0, eod_id_ = -1, num_tokens_ = 0;
  std::string tokenizer_, where_;
  bool has_sentences_ = true;
};

// Megatron's split of documents by ratios "a,b,c": boundaries round(cumsum(ratios) * n).
// Returns the 4 boundaries [0, n_train, n_train + n_valid, n].
std::vector<std::int64_t> split_documents(const std::string& ratios, std::int64_t n_docs);

}  // namespace trident
