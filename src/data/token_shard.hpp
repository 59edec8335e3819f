// Token shards: one HDF5 file per shard, the format of docs/DESIGN.md ("Token shards").
//   /tokens             1-D, uint16 when vocab_size <= 65536, else int32; chunked
//   /document_offsets   int64, n_docs + 1; document d is tokens[off[d]:off[d+1]]
//   /sentence_offsets   optional int64; sentence boundaries (token offsets) when split
//   root attributes: format = "trident.tokens", format_version, tokenizer, vocab_size, eod_id,
//                    max_token_id (format_version 2), tokenizer_digest (format_version 3)
// format_version 2 adds HDF5's Fletcher-32 checksum to every chunk of /tokens (verified by HDF5
// on every read) and max_token_id (checked against vocab_size when the shard opens); version 3
// adds tokenizer_digest, the digest of the tokenizer's files (Tokenizer::digest), so that two
// different tokenizer files never pass as the same tokenizer. Versions 1 and 2 are still read
// (version 1's tokens scanned once when the shard opens).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/special_tokens.hpp"

#include "io/hdf5_handle.hpp"

namespace trident {

inline constexpr const char* kTokenShardFormat = "trident.tokens";
inline constexpr std::int64_t kTokenShardVersion = 3;
// Tokens per chunk of /tokens written: 32 KiB of uint16. A read touches (and checksums) whole
// chunks, so smaller chunks serve the scattered per-document reads of a shuffled dataset faster
// (perf/results/data_scale_*.md: 16384 reads short documents 3x faster than 131072, the size
// used before 2026-12; both are read).
inline constexpr std::int64_t kTokenShardChunk = 16384;

struct TokenShardMeta {
  std::string path;
  // "trident.tokens" (an HDF5 shard) or "megatron.indexed" (a .bin/.idx pair named by its
  // prefix, data/indexed_dataset.hpp: tokenizer, vocab_size, eod_id and the special tokens come
  // from the deck's data.tokenizer_type, as Megatron's index records none of them).
  std::string format = kTokenShardFormat;
  std::string tokenizer;
  std::string tokenizer_digest;  // "" before format_version 3 (and for Megatron pairs)
  std::int64_t format_version = 0;
  std::int64_t vocab_size = 0;
  std::int64_t eod_id = -1;
  std::int64_t num_tokens = 0;
  std::int64_t num_documents = 0;
  std::int64_t max_token_id = -1;  // -1: no tokens, or a Megatron pair (not recorded; ids checked when read)
  bool has_sentences = false;
  // Optional root attributes cls_id, sep_id, mask_id, pad_id, bos_id, eos_id, sentinel_id,
  // num_sentinels (written by tokenizers that have those tokens; -1 / 0 when absent): the
  // special tokens BERT and T5 samples are built with (eod and unk are not read from here).
  SpecialTokens specials;
};

// Writes one shard. Data goes to "<path>.tmp" and is renamed to <path> by close(), so a
// crashed writer never leaves a file that looks complete. Serial HDF5 access (each MPI rank of
// preprocess_data writes its own shards).
class TokenShardWriter {
 public:
  TokenShardWriter(const std::string& path, const std::string& tokenizer, std::int64_t vocab_size, std::int64_t eod_id,
                   bool with_sentences);
  ~TokenShardWriter();  // abandons (removes the .tmp) if close() was not called
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends one document (its EOD token already appended by the caller when wanted).
  // sentence_ends: token counts, relative to the document start, at which sentences end
  // (only with with_sentences; the last must equal tokens.size()).
  void add_document(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& sentence_ends = {});
  std::int64_t num_tokens() const;
  std::int64_t num_documents() const;
  // Records the special-token attributes close() writes (ids of -1 and a sentinel count of 0
  // are left out).
  void set_special_tokens(const SpecialTokens& specials);
  // Records the tokenizer's digest (Tokenizer::digest) that close() writes.
  void set_tokenizer_digest(const std::string& digest);
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

inline constexpr const char* kIndexedFormat = "megatron.indexed";

class IndexedDatasetReader;

// A read-only list of int64 token offsets owned by a reader: a little-endian array in a mapped
// file (an HDF5 shard's contiguous /document_offsets or /sentence_offsets), an array in the
// heap (when the dataset is chunked or filtered), or computed from a Megatron index (the start
// of the sequence at a document index, or of every sequence).
class OffsetList {
 public:
  OffsetList() = default;
  static OffsetList array(const unsigned char* bytes, std::int64_t n);
  static OffsetList megatron_documents(const IndexedDatasetReader* r);
  static OffsetList megatron_sequences(const IndexedDatasetReader* r);
  std::int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  std::int64_t operator[](std::int64_t i) const;
  std::int64_t front() const { return (*this)[0]; }
  std::int64_t back() const { return (*this)[n_ - 1]; }
  std::vector<std::int64_t> to_vector() const;

 private:
  enum class Kind { array, documents, sequences } kind_ = Kind::array;
  const unsigned char* bytes_ = nullptr;
  const IndexedDatasetReader* megatron_ = nullptr;
  std::int64_t n_ = 0;
};

// Reads one shard: an HDF5 token shard, or a Megatron indexed dataset when `path` is a prefix
// P, P.bin or P.idx with P.idx present. Metadata and offsets are loaded on open (and validated:
// a malformed file throws Error::all naming the file and what is wrong); token ranges are
// streamed from disk (HDF5 hyperslab reads, or pread from the .bin).
// `indexed`: what a Megatron pair does not record (tokenizer, vocab_size, eod_id, specials),
// from the deck; opening a pair without it is an error naming data.tokenizer_type. A Megatron
// pair has sentences when its prefix ends in "_sentence" (Megatron's --split-sentences naming)
// or a document holds more than one sequence; empty sequences are dropped from the sentence
// offsets.
class TokenShardReader {
 public:
  explicit TokenShardReader(const std::string& path, const TokenShardMeta* indexed = nullptr);
  ~TokenShardReader();
  TokenShardReader(TokenShardReader&&) noexcept;
  TokenShardReader& operator=(TokenShardReader&&) noexcept;

  const TokenShardMeta& meta() const;
  // (num_documents + 1) and (sentences + 1) token offsets, each from 0 to num_tokens, memory-
  // mapped where the file allows (contiguous little-endian int64 datasets; Megatron's .idx).
  // Sentence offsets of a Megatron pair are its sequence starts: non-decreasing (a zero-length
  // sequence repeats an offset); an HDF5 shard's increase strictly.
  const OffsetList& document_offsets() const;
  const OffsetList& sentence_offsets() const;  // empty when absent
  // tokens[begin, begin + count) into out (count int32 values). Throws Error::all on a bad range,
  // a failed read (a chunk whose checksum does not match) or a token id outside the vocabulary.
  void read(std::int64_t begin, std::int64_t count, std::int32_t* out) const;

  // "" while the file is the one opened (same inode, size and modification time), else what
  // changed. Reads since the last call mark the shard as touched.
  std::string changed_on_disk() const;
  // The shards read since the last call that changed on disk since they were opened, as one
  // message naming each ("" when none); every shard alive in this process is looked at, so any
  // dataset's corpora are covered. Thread-safe against reads in the prefetcher thread.
  static std::string check_touched_shards();

  struct Impl;  // opaque

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident
