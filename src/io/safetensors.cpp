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
int dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

// Header lengths beyond this are refused before anything is read (the reference reader's limit).
constexpr std::uint64_t kMaxHeader = 100u << 20;

}  // namespace

int safetensors_dtype_size(const std::string& dtype) { return dtype_bytes(dtype); }

std::int64_t SafeTensorSpec::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

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
    const int es = dtype_bytes(t.dtype);
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
  std::vector<float> out(static_cast<size_t>(t.numel()));
  read_f32(t, 0, t.numel(), out.data());
  return out;
}

void SafetensorsReader::read_f32(const SafeTensorEntry& t, std::int64_t begin, std::int64_t n, float* out) const {
  const std::string where = "safetensors file '" + file_.path() + "', tensor '" + t.name + "'";
  TRIDENT_REQUIRE(begin >= 0 && n >= 0 && begin + n <= t.numel(),
                  where << ": elements [" << begin << ", " << begin + n << ") outside its " << t.numel());
  const auto count = static_cast<size_t>(n);
  if (t.dtype == "F32") {
    const unsigned char* p = file_.data() + data_start_ + t.begin + static_cast<std::uint64_t>(begin) * 4;
    guarded_map_read(where, [&] { std::memcpy(out, p, count * 4); });
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const unsigned char* p = file_.data() + data_start_ + t.begin + static_cast<std::uint64_t>(begin) * 2;
    // widened in blocks through a small buffer
    const bool bf = t.dtype == "BF16";
    std::uint16_t h[4096];
    for (size_t b = 0; b < count; b += 4096) {
      const size_t m = std::min<size_t>(4096, count - b);
      guarded_map_read(where, [&] { std::memcpy(h, p + b * 2, m * 2); });
      for (size_t i = 0; i < m; ++i) out[b + i] = bf ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
    }
  } else {
    throw Error::all(where + ": dtype " + t.dtype + " is not read (F32, BF16 and F16 are)");
  }
}

std::string safetensors_dtype(const std::string& name) {
  if (name == "fp32" || name == "F32" || name == "float32") return "F32";
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return "BF16";
  if (name == "fp16" || name == "F16" || name == "float16") return "F16";
  throw Error::all("dtype '" + name + "': expected fp32, bf16 or fp16");
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafeTensorSpec> tensors,
                                     const std::string& dtype, const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path + ".tmp"), dtype_(safetensors_dtype(dtype)), order_(std::move(tensors)) {
  elem_ = dtype_ == "F32" ? 4 : 2;
  std::sort(order_.begin(), order_.end(),
            [](const SafeTensorSpec& a, const SafeTensorSpec& b) { return a.name < b.name; });
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  for (size_t i = 0; i < order_.size(); ++i) {
    const auto& t = order_[i];
    TRIDENT_REQUIRE(i == 0 || order_[i - 1].name != t.name,
                    "safetensors file '" << path << "': tensor '" << t.name << "' twice");
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.numel()) * elem_;
    h[t.name] = {{"dtype", dtype_}, {"shape", t.shape}, {"data_offsets", {total_ * elem_, total_ * elem_ + bytes}}};
    total_ += static_cast<std::uint64_t>(t.numel());
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TRIDENT_REQUIRE(fd_ >= 0, "cannot create '" << tmp_ << "': " << std::strerror(errno));
  const std::uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  raw(len, 8);
  raw(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::remove(tmp_.c_str());
  }
}

void SafetensorsWriter::fail(const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::remove(tmp_.c_str());
  throw Error::all(what);
}

void SafetensorsWriter::raw(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write '" + tmp_ + "': " + std::strerror(w < 0 ? errno : ENOSPC));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void SafetensorsWriter::put(const float* values, std::int64_t n) {
  TRIDENT_REQUIRE(fd_ >= 0, "safetensors file '" << path_ << "': written after commit or a failure");
  if (n < 0 || done_ + static_cast<std::uint64_t>(n) > total_)
    fail("safetensors file '" + path_ + "': more values than its " + std::to_string(total_));
  if (elem_ == 4) {
    raw(values, static_cast<size_t>(n) * 4);
  } else {
    half_.resize(static_cast<size_t>(n));
    const bool bf = dtype_ == "BF16";
    for (size_t i = 0; i < half_.size(); ++i) half_[i] = bf ? float_to_bf16(values[i]) : float_to_fp16(values[i]);
    raw(half_.data(), half_.size() * 2);
  }
  done_ += static_cast<std::uint64_t>(n);
}

void SafetensorsWriter::commit() {
  TRIDENT_REQUIRE(fd_ >= 0, "safetensors file '" << path_ << "': committed twice or after a failure");
  if (done_ != total_)
    fail("safetensors file '" + path_ + "': " + std::to_string(done_) + " of its " + std::to_string(total_) +
         " values were given");
  const bool synced = ::fsync(fd_) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) {
    std::remove(tmp_.c_str());
    throw Error::all("cannot write '" + tmp_ + "': " + std::strerror(synced ? errno : sync_errno));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp_.c_str());
    throw Error::all("cannot rename '" + tmp_ + "' to '" + path_ + "': " + std::strerror(e));
  }
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafeTensorSpec> specs;
  std::map<std::string, const SafeTensorOut*> by_name;
  for (const auto& t : tensors) {
    const SafeTensorSpec spec{t.name, t.shape};
    TRIDENT_REQUIRE(spec.numel() == static_cast<std::int64_t>(t.values.size()),
                    "write_safetensors: tensor '" << t.name << "' has " << t.values.size() << " values for its shape");
    specs.push_back(spec);
    by_name[t.name] = &t;
  }
  SafetensorsWriter w(path, std::move(specs), dtype, metadata);
  for (const auto& spec : w.order()) {
    const auto& v = by_name.at(spec.name)->values;
    w.put(v.data(), static_cast<std::int64_t>(v.size()));
  }
  w.commit();
}

std::vector<std::pair<std::size_t, std::size_t>> plan_safetensors_shards(const std::vector<SafeTensorSpec>& tensors,
                                                                         int elem_bytes, std::uint64_t max_bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t b = static_cast<std::uint64_t>(tensors[i].numel()) * static_cast<std::uint64_t>(elem_bytes);
    if (groups.empty() || (max_bytes > 0 && bytes > 0 && bytes + b > max_bytes)) {
      groups.emplace_back(i, i);
      bytes = 0;
    }
    groups.back().second = i + 1;
    bytes += b;
  }
  return groups;
}

std::string safetensors_shard_name(std::size_t i, std::size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

std::string safetensors_index_json(const std::map<std::string, std::string>& weight_map, std::uint64_t total_size) {
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total_size}};
  j["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [name, file] : weight_map) j["weight_map"][name] = file;
  return j.dump(2) + "\n";
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t end = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  TRIDENT_REQUIRE(end > 0 && text[0] != '-', what << ": '" << text << "' is not a size (e.g. 5GB, 500MB, 2GiB)");
  const std::string unit = text.substr(end);
  static const std::map<std::string, std::uint64_t> units = {{"", 1},
                                                             {"B", 1},
                                                             {"KB", 1000ull},
                                                             {"MB", 1000000ull},
                                                             {"GB", 1000000000ull},
                                                             {"KiB", 1ull << 10},
                                                             {"MiB", 1ull << 20},
                                                             {"GiB", 1ull << 30}};
  const auto it = units.find(unit);
  TRIDENT_REQUIRE(it != units.end(),
                  what << ": unknown unit '" << unit << "' in '" << text << "' (B, KB, MB, GB, KiB, MiB, GiB)");
  TRIDENT_REQUIRE(v <= std::numeric_limits<std::uint64_t>::max() / it->second,
                  what << ": '" << text << "' is too large");
  return v * it->second;
}

}  // namespace trident
