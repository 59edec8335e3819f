// The dataset index cache (docs/DESIGN.md "Dataset index cache"): arrays of int64 that a
// dataset derives from its corpus (the GPT dataset's document order, document starts and sample
// order; the blending assignment) are built once, written to a file named by a hash of their
// key, and memory-mapped read-only by every process that needs them, so that the ranks of a
// node share one copy through the page cache and a restarted job does not rebuild them.
//
// File: "TRIDENT-INDEX\0\0\0" (16 bytes), uint64 version 1, uint64 key length, the key (padded
// with zeros to a multiple of 8), uint64 array count A, A uint64 lengths, the arrays (int64,
// little-endian), uint64 end marker. The key (every input the arrays depend on, including the
// shards' sizes and modification times) is compared in full when the file is opened: a file
// built from other inputs is rebuilt, never used.
//
// Building: the first process takes an exclusive flock on "<file>.lock", looks again, builds,
// writes "<file>.tmp.<host>.<pid>", fsyncs and renames it to <file>; the others wait on the lock
// and then map the file. Without working locks (some network file systems) several processes
// may build the same file; each rename is atomic and the contents are equal, so concurrent jobs
// never see a partial or mixed file. When the directory cannot be written, the arrays stay in
// the process's memory and origin() says why.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/mapped_file.hpp"

namespace trident {

class CachedIndex {
 public:
  std::size_t count() const { return ptr_.size(); }
  const std::int64_t* data(std::size_t k) const { return ptr_[k]; }
  std::int64_t size(std::size_t k) const { return n_[k]; }
  // "built in memory", "built, cached in F", "loaded from F", "built in memory (cannot write F: why)"
  const std::string& origin() const { return origin_; }
  // The file mapped ("" in memory): names it in errors.
  const std::string& file() const { return file_; }

 private:
  friend CachedIndex cached_index(const std::string&, const std::string&, const std::string&,
                                  const std::function<std::vector<std::vector<std::int64_t>>()>&);
  MappedFile map_;
  std::vector<std::vector<std::int64_t>> owned_;
  std::vector<const std::int64_t*> ptr_;
  std::vector<std::int64_t> n_;
  std::string origin_, file_;
};

// The arrays of `key`: loaded from dir/<kind>_<hash>.idx when it holds them, else built by
// build() and (dir not empty) cached there. dir "": in memory only.
CachedIndex cached_index(const std::string& dir, const std::string& kind, const std::string& key,
                         const std::function<std::vector<std::vector<std::int64_t>>()>& build);

// data.index_cache resolved for a corpus whose first shard is `first_shard`: "auto" ->
// "<its directory>/trident_index_cache", "none" -> "" (in memory), else the value.
std::string index_cache_dir(const std::string& setting, const std::string& first_shard);

}  // namespace trident
