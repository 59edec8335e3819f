// The per-rank work of preprocess_data (docs/DESIGN.md "Preprocessing command line"; the app,
// apps/preprocess_data.cpp, parses the flags, agrees errors over MPI and numbers the shards): the
// inputs named on the command line, the tokenization of each document (whole, or split into
// sentences; an EOD appended), and the shards of each JSON key written under temporary part names
// (ShardSink) that the app renames <output-prefix>_NNNNN.h5 in input order at the end.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/compressed_input.hpp"
#include "data/tokenizer.hpp"
#include "data/token_shard.hpp"

namespace trident {

struct PreprocessOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string tokenizer_type;
  std::string vocab_file, merge_file, tokenizer_model;
  std::vector<std::string> json_keys{"text"};
  // the output prefix of each key: --output-prefix for one key, <prefix>_<key> for several
  std::vector<std::string> prefixes() const;
  bool append_eod = false;
  bool split_sentences = false;
  int vocab_extra_ids = 0;
  std::int64_t shard_tokens = 0;
  std::int64_t log_interval = 100;
  bool overwrite = false;
};

struct PreprocessInput {
  std::string path;
  std::int64_t size = 0;  // decoded bytes (a compressed file's are measured by decoding it once)
  bool jsonl = false;
  std::int64_t stored = 0;  // bytes on disk
  bool compressed() const { return compression_of(path) != Compression::none; }
};

// Whether a file is JSON lines by its name (.json / .jsonl, before a compression extension).
bool is_jsonl_input(const std::string& path);

// Expands the --input list (globs sorted); throws Error::all on a missing file or an empty glob.
// Compressed files get size -1 (measured later by decoding them).
std::vector<PreprocessInput> expand_inputs(const std::vector<std::string>& patterns);

// 1-based line number of (decoded) byte `offset` in a file, for error messages.
std::int64_t line_number_at(const std::string& path, std::int64_t offset);

struct PreprocessStats {
  std::int64_t documents = 0, skipped = 0, tokens = 0, sentences = 0, bytes = 0, shards = 0;
};

// The shards of one output prefix written by one rank: part files <prefix>.part-rRRRRR-KKKKK.h5,
// a new one whenever --shard-tokens is reached.
class ShardSink {
 public:
  ShardSink(const PreprocessOptions& o, const Tokenizer& tok, int rank, std::string prefix);
  void add(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& sentence_ends);
  void finish_shard();
  // Drops the open shard (its .tmp) and the finished ones: after an error.
  void discard();
  const std::vector<std::string>& parts() const { return parts_; }
  const std::string& prefix() const { return prefix_; }
  static std::string part_name(const std::string& prefix, int rank, int k);

 private:
  const PreprocessOptions& o_;
  const Tokenizer& tok_;
  int rank_;
  std::string prefix_;
  std::unique_ptr<TokenShardWriter> writer_;
  std::vector<std::string> parts_;
};

// One rank's tokenization: documents of JSON-lines byte ranges and of whole plain-text files into
// one ShardSink per --json-keys key; rank 0 prints progress every --log-interval documents.
class PreprocessWorker {
 public:
  PreprocessWorker(const PreprocessOptions& o, const Tokenizer& tok, int rank, int nranks, std::int64_t my_bytes);
  // One document's text, for the shards of key k.
  void document(std::string_view text, std::size_t k = 0);
  void add_bytes(std::int64_t n) { stats_.bytes += n; }
  void progress() const;
  // The JSON-lines records whose first byte lies in [begin, end) of the file.
  void jsonl_range(const PreprocessInput& f, std::int64_t begin, std::int64_t end);
  void plain_file(const PreprocessInput& f);
  std::vector<std::unique_ptr<ShardSink>>& sinks() { return sinks_; }
  const PreprocessStats& stats() const { return stats_; }

 private:
  const PreprocessOptions& o_;
  const Tokenizer& tok_;
  int rank_, nranks_;
  std::int64_t my_bytes_;
  std::vector<std::unique_ptr<ShardSink>> sinks_;  // one per --json-keys key
  std::vector<std::string> texts_;                 // a JSON line's text of each key
  PreprocessStats stats_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int64_t> ends_;
};

// <prefix>_NNNNN.h5: the final name of shard `index`.
std::string shard_final_name(const std::string& prefix, std::int64_t index);
// Files <prefix>_<digits>.h5 in the prefix's directory, with their index.
std::vector<std::pair<std::int64_t, std::string>> existing_shards(const std::string& prefix);

}  // namespace trident
