// A file mapped read-only into memory (mmap, MAP_SHARED): the pages come from the page cache,
// so every process of a node that maps the same file shares one copy. Used for the offsets of
// token shards, the index of Megatron indexed datasets and the dataset index cache.
//
// A mapped file that shrinks under the process raises SIGBUS on the next read of a page past
// its new end. Reads from mappings go through guarded_map_read, which turns that SIGBUS into
// an Error::all (the handler, installed with the first mapping, jumps back to the guard; the
// guarded code reads memory only, no resources are held across the jump). A SIGBUS outside any
// guard prints one error line and ends the process with status 1.
#pragma once
#include <setjmp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "common/error.hpp"

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

namespace detail {
struct BusGuard {
  sigjmp_buf env;
  BusGuard* prev = nullptr;
};
extern thread_local BusGuard* t_bus_guard;
void install_bus_handler();
}  // namespace detail

// f() with SIGBUS from a mapped file turned into Error::all("<context>: ..."). f must only read
// memory and compute (no allocation that a jump would leak, no locks, no library calls).
template <class F>
decltype(auto) guarded_map_read(const std::string& context, F&& f) {
  detail::BusGuard g;
  g.prev = detail::t_bus_guard;
  if (sigsetjmp(g.env, 0) != 0) {
    detail::t_bus_guard = g.prev;
    throw Error::all(context + " changed while the job reads it: a memory-mapped file shrank (SIGBUS)");
  }
  detail::t_bus_guard = &g;
  struct Restore {
    detail::BusGuard* prev;
    ~Restore() { detail::t_bus_guard = prev; }
  } restore{g.prev};
  return std::forward<F>(f)();
}

}  // namespace trident
