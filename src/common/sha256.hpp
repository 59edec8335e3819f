// SHA-256 (FIPS 180-4) of bytes and of files, as 64 lower-case hex digits: the digests that name
// a tokenizer's files in token shards (docs/DESIGN.md "Token shards").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace trident {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex();  // finishes the digest (the object is spent)

 private:
  void block(const unsigned char* p);
  std::uint32_t h_[8];
  unsigned char buf_[64];
  std::size_t used_ = 0;
  std::uint64_t bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// The digest of a file's contents; throws Error::all naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace trident
