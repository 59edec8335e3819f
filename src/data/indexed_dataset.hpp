// Megatron's indexed datasets ("MMapIndexedDataset"): a token corpus as two files sharing a
// prefix, P.bin (the tokens of every sequence, back to back, in one integer type) and P.idx:
//   bytes 0..8    magic "MMIDIDX\0\0"
//   uint64        version (1)
//   uint8         dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//                 7 float32, 8 uint16 (token data must be integer: 6 and 7 are refused)
//   uint64        S, the number of sequences
//   uint64        D, the number of document indices (documents + 1)
//   int32[S]      sequence lengths, in tokens
//   int64[S]      sequence pointers, byte offsets into P.bin
//   int64[D]      document indices: document d is sequences [doc[d], doc[d+1]); doc[0] = 0,
//                 doc[D-1] = S
// All little-endian. A sequence is a document (GPT's "_text_document") or, with
// --split-sentences, a sentence ("_text_sentence"). The multimodal variant (a mode byte per
// sequence after the document indices) is refused. docs/DESIGN.md "Megatron indexed datasets".
//
// The .idx is memory-mapped, so the ranks of a node share one copy in the page cache; tokens
// are read from the .bin with pread, so that a file truncated under a running job gives an error
// naming it rather than a SIGBUS.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.hpp"

namespace trident {

// Megatron's dtype codes (the numbers stored in the .idx).
enum class IndexedDtype : std::uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8
};
// Bytes per element of a dtype code; 0 for a code Megatron does not define.
std::size_t indexed_dtype_size(int code);
const char* indexed_dtype_name(int code);
// Megatron's choice (DType.optimal_dtype): uint16 when vocab_size < 65500, else int32.
IndexedDtype megatron_optimal_dtype(std::int64_t vocab_size);

// The prefix of a Megatron pair named by `path`: "P" for "P", "P.bin" or "P.idx" when P.idx
// exists; "" when `path` is not such a pair.
std::string indexed_dataset_prefix(const std::string& path);

// Reads one pair. The constructor validates the whole index against the .bin's size; each
// problem throws Error::all naming the file and what is wrong.
class IndexedDatasetReader {
 public:
  explicit IndexedDatasetReader(const std::string& prefix);
  ~IndexedDatasetReader();

  const std::string& prefix() const { return prefix_; }
  std::string idx_path() const { return prefix_ + ".idx"; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  int dtype_code() const { return dtype_; }
  std::size_t element_size() const { return elem_; }
  std::int64_t num_sequences() const { return num_seq_; }
  std::int64_t num_documents() const { return num_doc_idx_ - 1; }
  std::int64_t num_tokens() const { return num_tokens_; }
  // Read from the mapped index (no copy).
  std::int32_t sequence_length(std::int64_t s) const { return idx_.load<std::int32_t>(lengths_at_ + 4 * s); }
  std::int64_t sequence_pointer(std::int64_t s) const { return idx_.load<std::int64_t>(pointers_at_ + 8 * s); }
  std::int64_t document_index(std::int64_t d) const { return idx_.load<std::int64_t>(docs_at_ + 8 * d); }
  // Token offset (not bytes) where sequence s starts; s == num_sequences() gives num_tokens().
  std::int64_t sequence_start(std::int64_t s) const {
    return s == num_seq_ ? num_tokens_ : sequence_pointer(s) / static_cast<std::int64_t>(elem_);
  }
  // tokens[begin, begin + count) of the whole .bin, converted to int32. Throws Error::all on a
  // short read or a value that does not fit int32.
  void read(std::int64_t begin, std::int64_t count, std::int32_t* out) const;

 private:
  std::string prefix_;
  MappedFile idx_;
  int fd_ = -1;  // the .bin
  int dtype_ = 0;
  std::size_t elem_ = 0;
  std::int64_t num_seq_ = 0, num_doc_idx_ = 0, num_tokens_ = 0;
  std::size_t lengths_at_ = 0, pointers_at_ = 0, docs_at_ = 0;
};

// Writes one pair: tokens stream to P.bin.tmp, the index is kept in memory (12 bytes per
// sequence, 8 per document) and written by close() to P.idx.tmp; then P.bin and P.idx take their
// names, the .idx last, so a pair whose .idx exists is complete. An unclosed writer removes its
// temporary files.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, IndexedDtype dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document of one sequence per entry of sequence_ends (token counts from the document
  // start, strictly increasing, the last equal to tokens.size()); empty: one sequence. An empty
  // document adds a document index and no sequence.
  void add_document(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& sequence_ends = {});
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident
