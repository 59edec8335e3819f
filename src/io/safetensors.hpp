// The safetensors format (Hugging Face's weight files), read and written here from its public
// description: an unsigned 64-bit little-endian header length N, then N bytes of JSON (an object
// whose keys are tensor names, each {"dtype", "shape", "data_offsets": [begin, end]}, plus an
// optional "__metadata__" object of strings), then the tensors' raw little-endian bytes, the
// offsets counted from the end of the header. A reader accepts only a header whose tensors
// exactly tile the data area (no gap, no overlap, nothing past the end), as the reference
// implementation does; every violation is an error naming the file and the tensor.
//
// Trident's converter (apps/convert_checkpoint.cpp) reads F32, BF16 and F16 tensors (widened to
// fp32) and writes F32, BF16 or F16 (rounded to nearest even).
#pragma once
#include <cstdint>
#include <map>
#include <string>
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

// Writes `tensors` (in name order, back to back) as dtype "F32", "BF16" or "F16" to `path`; the
// header is padded with spaces to a multiple of 8 bytes so that every tensor starts aligned.
// Written to `path`.tmp, flushed to disk and renamed; throws Error::all naming the file.
void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata);

// The safetensors dtype name of Trident's 32- and 16-bit names ("fp32" -> "F32", "bf16" ->
// "BF16", "fp16" -> "F16"); the safetensors names are accepted as they are. Throws otherwise.
std::string safetensors_dtype(const std::string& name);

}  // namespace trident
