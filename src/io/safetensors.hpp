// The safetensors format (Hugging Face's weight files), read and written here from its public
// description: an unsigned 64-bit little-endian header length N, then N bytes of JSON (an object
// whose keys are tensor names, each {"dtype", "shape", "data_offsets": [begin, end]}, plus an
// optional "__metadata__" object of strings), then the tensors' raw little-endian bytes, the
// offsets counted from the end of the header. A reader accepts only a header whose tensors
// exactly tile the data area (no gap, no overlap, nothing past the end), as the reference
// implementation does; every violation is an error naming the file and the tensor.
//
// Trident's converter (checkpoint/hf_convert) reads F32, BF16 and F16 tensors (widened to fp32),
// whole or in parts, and writes F32, BF16 or F16 (rounded to nearest even) as a stream, sharded
// as Hugging Face shards a model (model-0000i-of-0000n.safetensors and
// model.safetensors.index.json).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/mapped_file.hpp"

namespace trident {

struct SafeTensorEntry {
  std::string name;
  std::string dtype;                 // "F32", "BF16", "F16", ... as in the header
  std::vector<std::int64_t> shape;   // row-major
  std::uint64_t begin = 0, end = 0;  // byte range within the data area
  std::int64_t numel() const;
};

class SafetensorsReader {
 public:
  // Maps `path` and checks its header (see the file comment). Throws Error::all naming the file.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return file_.path(); }
  // In the order of their data offsets.
  const std::vector<SafeTensorEntry>& tensors() const { return tensors_; }
  const SafeTensorEntry* find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's values as fp32 (F32 as stored, BF16 and F16 widened exactly); other dtypes are
  // refused with an error naming the tensor.
  std::vector<float> read_f32(const SafeTensorEntry& t) const;
  // Elements [begin, begin + n) of the tensor (row-major) as fp32 into out: a part of a large
  // tensor read straight from the mapping, without a copy of the whole.
  void read_f32(const SafeTensorEntry& t, std::int64_t begin, std::int64_t n, float* out) const;

 private:
  MappedFile file_;
  std::uint64_t data_start_ = 0;
  std::vector<SafeTensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct SafeTensorOut {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // row-major, numel(shape) values
};

// A tensor to be written: its name and row-major shape.
struct SafeTensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel() const;
};

// Writes one safetensors file as a stream: the header first (the tensors in name order, back to
// back, as dtype "F32", "BF16" or "F16"; padded with spaces to a multiple of 8 bytes so that every
// tensor starts aligned), then the values, given in the order of order() in parts of any size
// through put() (rounded to nearest even for 16 bits). Nothing but the part being converted is
// held, so a file of any size is written in bounded memory. The file is `path`.tmp until commit()
// (all values given: flushed to disk and renamed); a writer destroyed before commit() removes it.
// Errors are Error::all naming the file.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<SafeTensorSpec> tensors, const std::string& dtype,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // The tensors in the order their values are expected (name order).
  const std::vector<SafeTensorSpec>& order() const { return order_; }
  // The next n values of the stream (they may end one tensor and start the next).
  void put(const float* values, std::int64_t n);
  void commit();
  // Bytes of tensor data (the header excluded).
  std::uint64_t data_bytes() const { return total_ * elem_; }

 private:
  void raw(const void* p, std::size_t n);
  void fail(const std::string& what);
  std::string path_, tmp_, dtype_;
  std::vector<SafeTensorSpec> order_;
  std::uint64_t elem_ = 4, total_ = 0, done_ = 0;
  int fd_ = -1;
  std::vector<std::uint16_t> half_;
};

// Writes `tensors` as one file through SafetensorsWriter (all values in memory).
void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata);

// Bytes per value of a safetensors dtype name ("F32" 4, "BF16" and "F16" 2, ...; 0 unknown).
int safetensors_dtype_size(const std::string& dtype);

// Hugging Face's sharding of a model's weights: the tensors, in the order given, cut into
// consecutive groups of at most max_bytes of data each (a tensor larger than that alone in its
// group); max_bytes 0 means one group. Returns the index ranges [first, last) of the groups.
std::vector<std::pair<std::size_t, std::size_t>> plan_safetensors_shards(const std::vector<SafeTensorSpec>& tensors,
                                                                         int elem_bytes, std::uint64_t max_bytes);
// "model.safetensors" for one shard, else "model-0000i-of-0000n.safetensors" (i from 1).
std::string safetensors_shard_name(std::size_t i, std::size_t n);
// model.safetensors.index.json: {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
std::string safetensors_index_json(const std::map<std::string, std::string>& weight_map, std::uint64_t total_size);
// A size with an optional unit: "5GB" (10^9), "500MB" (10^6), "2GiB" (2^30), "123" (bytes); 0 is
// allowed. Throws Error::all naming `what` otherwise.
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);

// The safetensors dtype name of Trident's 32- and 16-bit names ("fp32" -> "F32", "bf16" ->
// "BF16", "fp16" -> "F16"); the safetensors names are accepted as they are. Throws otherwise.
std::string safetensors_dtype(const std::string& name);

}  // namespace trident
