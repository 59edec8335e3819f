// Compressed raw input for preprocess_data: .zst (Zstandard), .gz (gzip) and .xz files, decoded
// as a stream through Debian's libzstd, zlib and liblzma; nothing is decompressed to disk.
// Multi-frame / multi-member / concatenated streams are read to their end. The compression is
// told by the file name's last extension and confirmed by the file's magic bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace trident {

enum class Compression { none, zstd, gzip, xz };

// By the last extension: .zst / .zstd, .gz, .xz; anything else is none.
Compression compression_of(const std::string& path);
const char* compression_name(Compression c);
// The name without its compression extension ("a.jsonl.zst" -> "a.jsonl").
std::string without_compression_extension(const std::string& path);

// Reads the decoded bytes of a file (a plain file is read as it is). Errors (a file that cannot
// be opened, a magic that does not match the extension, corrupt or truncated data) throw
// Error::one naming the file and the decoded offset.
class DecodedReader {
 public:
  explicit DecodedReader(const std::string& path);
  ~DecodedReader();
  DecodedReader(const DecodedReader&) = delete;
  DecodedReader& operator=(const DecodedReader&) = delete;
  // Up to n decoded bytes into out; 0 only at the end of the data.
  std::size_t read(char* out, std::size_t n);
  std::int64_t decoded_offset() const;  // bytes returned so far

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The decoded size of a file: the file size when not compressed, else one full decoding pass.
std::int64_t decoded_size(const std::string& path);

}  // namespace trident
