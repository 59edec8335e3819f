#include "io/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "common/half.hpp"

namespace trident {

namespace {

// Bytes per element of the dtypes the format defines (0: unknown).
int dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

// Header lengths beyond this are refused before anything is read (the reference reader's limit).
constexpr std::uint64_t kMaxHeader = 100u << 20;

}  // namespace

std::int64_t SafeTensorEntry::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(path) {
  const std::string where = "safetensors file '" + path + "'";
  TRIDENT_REQUIRE(file_.size() >= 8, where << " is " << file_.size() << " bytes: too short for a header length");
  const std::uint64_t n = guarded_map_read(where, [&] { return file_.load<std::uint64_t>(0); });
  TRIDENT_REQUIRE(n <= kMaxHeader && n <= file_.size() - 8,
                  where << ": header length " << n << " exceeds the file (" << file_.size()
                        << " bytes) or the format's 100 MiB limit: not a safetensors file");
  std::string text(static_cast<size_t>(n), '\0');
  guarded_map_read(where, [&] { std::memcpy(&text[0], file_.data() + 8, static_cast<size_t>(n)); });
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error::all(where + ": the header is not JSON (" + e.what() + ")");
  }
  TRIDENT_REQUIRE(h.is_object(), where << ": the header is not a JSON object");
  data_start_ = 8 + n;
  const std::uint64_t data_size = file_.size() - data_start_;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      TRIDENT_REQUIRE(it->is_object(), where << ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        TRIDENT_REQUIRE(m->is_string(), where << ": __metadata__ value '" << m.key() << "' is not a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string tw = where + ", tensor '" + it.key() + "'";
    const auto& v = *it;
    TRIDENT_REQUIRE(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
                    tw << ": needs dtype, shape and data_offsets");
    TRIDENT_REQUIRE(v["dtype"].is_string(), tw << ": dtype is not a string");
    SafeTensorEntry t;
    t.name = it.key();
    t.dtype = v["dtype"].get<std::string>();
    const int es = dtype_size(t.dtype);
    TRIDENT_REQUIRE(es > 0, tw << ": unknown dtype '" << t.dtype << "'");
    TRIDENT_REQUIRE(v["shape"].is_array(), tw << ": shape is not an array");
    std::uint64_t numel = 1;
    for (const auto& s : v["shape"]) {
      TRIDENT_REQUIRE(s.is_number_unsigned(), tw << ": shape holds " << s.dump() << ", not a non-negative integer");
      const auto d = s.get<std::uint64_t>();
      TRIDENT_REQUIRE(d == 0 || numel <= std::numeric_limits<std::uint64_t>::max() / 8 / d, tw << ": shape overflows");
      numel *= d;
      t.shape.push_back(static_cast<std::int64_t>(d));
    }
    const auto& off = v["data_offsets"];
    TRIDENT_REQUIRE(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                    tw << ": data_offsets is not a pair of non-negative integers");
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    TRIDENT_REQUIRE(t.begin <= t.end && t.end <= data_size, tw << ": data_offsets [" << t.begin << ", " << t.end
                                                               << ") lie outside the " << data_size
                                                               << " bytes of data");
    TRIDENT_REQUIRE(t.end - t.begin == numel * static_cast<std::uint64_t>(es),
                    tw << ": " << t.end - t.begin << " bytes for " << numel << " " << t.dtype << " values");
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafeTensorEntry& a, const SafeTensorEntry& b) { return a.begin < b.begin; });
  std::uint64_t at = 0;
  for (const auto& t : tensors_) {
    TRIDENT_REQUIRE(t.begin == at, where << ": tensor '" << t.name << "' starts at byte " << t.begin << " of the data, "
                                         << (t.begin < at ? "overlapping the previous tensor" : "leaving a gap")
                                         << " (expected " << at << ")");
    at = t.end;
  }
  TRIDENT_REQUIRE(at == data_size, where << ": " << data_size - at << " bytes after the last tensor");
}

const SafeTensorEntry* SafetensorsReader::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> SafetensorsReader::read_f32(const SafeTensorEntry& t) const {
  const std::string where = "safetensors file '" + file_.path() + "', tensor '" + t.name + "'";
  const auto n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  const unsigned char* p = file_.data() + data_start_ + t.begin;
  if (t.dtype == "F32") {
    guarded_map_read(where, [&] { std::memcpy(out.data(), p, n * 4); });
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    std::vector<std::uint16_t> h(n);
    guarded_map_read(where, [&] { std::memcpy(h.data(), p, n * 2); });
    const bool bf = t.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) out[i] = bf ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
  } else {
    throw Error::all(where + ": dtype " + t.dtype + " is not read (F32, BF16 and F16 are)");
  }
  return out;
}

std::string safetensors_dtype(const std::string& name) {
  if (name == "fp32" || name == "F32" || name == "float32") return "F32";
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return "BF16";
  if (name == "fp16" || name == "F16" || name == "float16") return "F16";
  throw Error::all("dtype '" + name + "': expected fp32, bf16 or fp16");
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata) {
  const std::string d = safetensors_dtype(dtype);
  const std::uint64_t es = d == "F32" ? 4 : 2;
  std::vector<const SafeTensorOut*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const SafeTensorOut* a, const SafeTensorOut* b) { return a->name < b->name; });
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const auto* t : order) {
    std::int64_t numel = 1;
    for (auto s : t->shape) numel *= s;
    TRIDENT_REQUIRE(numel == static_cast<std::int64_t>(t->values.size()), "write_safetensors: tensor '"
                                                                              << t->name << "' has " << t->values.size()
                                                                              << " values for its shape");
    const std::uint64_t bytes = static_cast<std::uint64_t>(numel) * es;
    h[t->name] = {{"dtype", d}, {"shape", t->shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TRIDENT_REQUIRE(fd >= 0, "cannot create '" << tmp << "': " << std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = errno;
        ::close(fd);
        std::remove(tmp.c_str());
        throw Error::all("cannot write '" + tmp + "': " + std::strerror(w < 0 ? e : ENOSPC));
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  const std::uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  put(len, 8);
  put(header.data(), header.size());
  std::vector<std::uint16_t> half;
  for (const auto* t : order) {
    if (es == 4) {
      put(t->values.data(), t->values.size() * 4);
      continue;
    }
    half.resize(t->values.size());
    for (size_t i = 0; i < half.size(); ++i)
      half[i] = d == "BF16" ? float_to_bf16(t->values[i]) : float_to_fp16(t->values[i]);
    put(half.data(), half.size() * 2);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    std::remove(tmp.c_str());
    throw Error::all("cannot write '" + tmp + "': " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error::all("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
}

}  // namespace trident
