// cached_index: load, or lock / build / write / rename / map (index_cache.hpp).
#include "data/index_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/rng.hpp"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr char kMagic[16] = {'T', 'R', 'I', 'D', 'E', 'N', 'T', '-', 'I', 'N', 'D', 'E', 'X', 0, 0, 0};
constexpr std::uint64_t kVersion = 1;
constexpr std::uint64_t kEnd = 0x58454449444E45ull;  // "ENDIDEX"

std::size_t pad8(std::size_t n) { return (n + 7) / 8 * 8; }

// The arrays of `path` when it is a complete file of `key`; false otherwise (missing, another
// key, another version, truncated).
bool try_load(const std::string& path, const std::string& key, MappedFile& map, std::vector<const std::int64_t*>& ptr,
              std::vector<std::int64_t>& n) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  MappedFile m(path);
  const std::size_t size = m.size();
  return guarded_map_read("dataset index cache '" + path + "'", [&] {
    if (size < 48 || std::memcmp(m.data(), kMagic, 16) != 0) return false;
    if (m.load<std::uint64_t>(16) != kVersion) return false;
    const auto klen = m.load<std::uint64_t>(24);
    if (klen != key.size() || 32 + pad8(klen) + 8 > size) return false;
    if (std::memcmp(m.data() + 32, key.data(), key.size()) != 0) return false;
    std::size_t at = 32 + pad8(klen);
    const auto count = m.load<std::uint64_t>(at);
    at += 8;
    if (count > 64 || at + 8 * count > size) return false;
    std::vector<std::int64_t> lengths(count);
    std::size_t total = at + 8 * count;
    for (std::size_t k = 0; k < count; ++k) {
      lengths[k] = m.load<std::int64_t>(at + 8 * k);
      if (lengths[k] < 0 || static_cast<std::uint64_t>(lengths[k]) > size / 8) return false;
      total += 8 * static_cast<std::size_t>(lengths[k]);
    }
    if (total + 8 != size || m.load<std::uint64_t>(total) != kEnd) return false;
    std::size_t off = at + 8 * count;
    ptr.clear();
    n = lengths;
    for (std::size_t k = 0; k < count; ++k) {
      ptr.push_back(reinterpret_cast<const std::int64_t*>(m.data() + off));
      off += 8 * static_cast<std::size_t>(lengths[k]);
    }
    map = std::move(m);
    return true;
  });
}

// Writes the arrays to `path` through a temporary file; "" or the reason it failed.
std::string write_file(const std::string& path, const std::string& key,
                       const std::vector<std::vector<std::int64_t>>& arrays) {
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  const std::string tmp = path + ".tmp." + host + "." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return "cannot create '" + tmp + "'";
    auto put = [&](const void* p, std::size_t n) {
      f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    };
    const std::uint64_t klen = key.size(), count = arrays.size();
    put(kMagic, 16);
    put(&kVersion, 8);
    put(&klen, 8);
    put(key.data(), key.size());
    const char zeros[8] = {};
    put(zeros, pad8(key.size()) - key.size());
    put(&count, 8);
    for (const auto& a : arrays) {
      const auto len = static_cast<std::int64_t>(a.size());
      put(&len, 8);
    }
    for (const auto& a : arrays) put(a.data(), 8 * a.size());
    put(&kEnd, 8);
    f.flush();
    if (!f) {
      f.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      return "cannot write '" + tmp + "' (disk full?)";
    }
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return "cannot rename '" + tmp + "' to '" + path + "'";
  }
  return "";
}

}  // namespace

std::string index_cache_dir(const std::string& setting, const std::string& first_shard) {
  if (setting == "none") return "";
  if (setting != "auto") return setting;
  const fs::path p(first_shard);
  return ((p.has_parent_path() ? p.parent_path() : fs::path(".")) / "trident_index_cache").string();
}

CachedIndex cached_index(const std::string& dir, const std::string& kind, const std::string& key,
                         const std::function<std::vector<std::vector<std::int64_t>>()>& build) {
  CachedIndex out;
  auto keep = [&](std::vector<std::vector<std::int64_t>> arrays, const std::string& why) {
    out.owned_ = std::move(arrays);
    out.ptr_.clear();
    out.n_.clear();
    for (const auto& a : out.owned_) {
      out.ptr_.push_back(a.data());
      out.n_.push_back(static_cast<std::int64_t>(a.size()));
    }
    out.origin_ = "built in memory" + (why.empty() ? std::string() : " (" + why + ")");
  };
  auto in_memory = [&](const std::string& why) {
    keep(build(), why);
    return std::move(out);
  };
  if (dir.empty()) return in_memory("");
  char name[64];
  std::snprintf(name, sizeof name, "_%016llx.idx", static_cast<unsigned long long>(hash_string(key)));
  const std::string path = (fs::path(dir) / (kind + name)).string();
  if (try_load(path, key, out.map_, out.ptr_, out.n_)) {
    out.origin_ = "loaded from " + path;
    out.file_ = path;
    return out;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return in_memory("cannot create the cache directory '" + dir + "': " + ec.message());
  // one builder at a time (where the file system supports flock)
  const std::string lock_path = path + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return in_memory("cannot create '" + lock_path + "': " + std::strerror(errno));
  struct Unlock {
    int fd;
    ~Unlock() {
      ::flock(fd, LOCK_UN);
      ::close(fd);
    }
  } unlock{lock};
  while (::flock(lock, LOCK_EX) != 0 && errno == EINTR) {
  }
  if (try_load(path, key, out.map_, out.ptr_, out.n_)) {  // built by another process meanwhile
    out.origin_ = "loaded from " + path;
    out.file_ = path;
    return out;
  }
  auto arrays = build();
  const std::string failed = write_file(path, key, arrays);
  if (failed.empty() && try_load(path, key, out.map_, out.ptr_, out.n_)) {
    out.origin_ = "built, cached in " + path;
    out.file_ = path;
    return out;
  }
  keep(std::move(arrays), failed.empty() ? "the written cache " + path + " did not read back" : failed);
  return out;
}

}  // namespace trident
