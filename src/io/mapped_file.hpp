// A file mapped read-only into memory (mmap, MAP_SHARED): the pages come from the page cache,
// so every process of a node that maps the same file shares one copy. Used for the index of
// Megatron indexed datasets (data/indexed_dataset.*).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace trident {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole of `path`; throws Error::all naming the file when it cannot be opened or
  // mapped. An empty file maps to size() == 0 and data() == nullptr.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // A little-endian value of type T at byte `offset` (any alignment; the caller has checked
  // that offset + sizeof(T) <= size()).
  template <class T>
  T load(std::size_t offset) const {
    T v;
    std::memcpy(&v, data_ + offset, sizeof(T));
    return v;
  }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace trident
