// Megatron indexed datasets: the reader (validation of the mapped .idx against the .bin, token
// reads by pread with conversion to int32) and the writer (the converter's output).
#include "data/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/error.hpp"

namespace trident {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

bool file_exists(const std::string& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One element of a .bin buffer as int64.
std::int64_t element(const unsigned char* p, int code) {
  switch (code) {
    case 1: return *p;
    case 2: return static_cast<std::int8_t>(*p);
    case 3: {
      std::int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case 5: {
      std::int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case 8: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    default: return -1;
  }
}

}  // namespace

std::size_t indexed_dtype_size(int code) {
  switch (code) {
    case 1:
    case 2: return 1;
    case 3:
    case 8: return 2;
    case 4:
    case 7: return 4;
    case 5:
    case 6: return 8;
    default: return 0;
  }
}

const char* indexed_dtype_name(int code) {
  static const char* const names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? names[code] : "unknown";
}

IndexedDtype megatron_optimal_dtype(std::int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDtype::uint16 : IndexedDtype::int32;
}

std::string indexed_dataset_prefix(const std::string& path) {
  std::string prefix = path;
  if (ends_with(path, ".idx") || ends_with(path, ".bin")) prefix = path.substr(0, path.size() - 4);
  return file_exists(prefix + ".idx") ? prefix : std::string();
}

// ------------------------------------------------------------------------------------------
// Reader
// ------------------------------------------------------------------------------------------

IndexedDatasetReader::IndexedDatasetReader(const std::string& prefix) : prefix_(prefix) {
  const std::string idx = idx_path(), bin = bin_path();
  const std::string where = "Megatron index '" + idx + "'";
  TRIDENT_REQUIRE(file_exists(idx), where << ": file does not exist");
  TRIDENT_REQUIRE(file_exists(bin),
                  "Megatron indexed dataset '" << prefix << "': its data file '" << bin << "' does not exist");
  idx_ = MappedFile(idx);
  const std::size_t size = idx_.size();
  TRIDENT_REQUIRE(size >= kHeaderBytes, where << ": " << size << " bytes, shorter than the " << kHeaderBytes
                                              << "-byte header (truncated, or not an index)");
  TRIDENT_REQUIRE(std::memcmp(idx_.data(), kMagic, 9) == 0,
                  where << ": wrong magic (expected \"MMIDIDX\\0\\0\"): not a Megatron MMapIndexedDataset index");
  const auto version = idx_.load<std::uint64_t>(9);
  TRIDENT_REQUIRE(version == 1, where << ": version " << version << " is not supported (this build reads 1)");
  dtype_ = idx_.data()[17];
  elem_ = indexed_dtype_size(dtype_);
  TRIDENT_REQUIRE(elem_ > 0, where << ": unknown dtype code " << dtype_ << " (Megatron defines 1..8)");
  TRIDENT_REQUIRE(dtype_ != 6 && dtype_ != 7,
                  where << ": dtype " << indexed_dtype_name(dtype_) << " (code " << dtype_ << ") holds no token ids");
  const auto n_seq = idx_.load<std::uint64_t>(18), n_doc = idx_.load<std::uint64_t>(26);
  // the sizes must add up before anything is read from the arrays
  const std::uint64_t limit = size;  // each count is at most the file size
  TRIDENT_REQUIRE(n_seq <= limit && n_doc <= limit && n_doc >= 1,
                  where << ": sequence count " << n_seq << " and document-index count " << n_doc
                        << " do not fit the file (" << size << " bytes; at least one document index)");
  const std::uint64_t expect = kHeaderBytes + 12 * n_seq + 8 * n_doc;
  TRIDENT_REQUIRE(size == expect,
                  where << ": " << size << " bytes, but the header's " << n_seq << " sequences and " << n_doc
                        << " document indices need " << expect
                        << (size == expect + n_seq ? " (a multimodal index, with sequence modes: not supported)"
                                                   : " (truncated or corrupt)"));
  num_seq_ = static_cast<std::int64_t>(n_seq);
  num_doc_idx_ = static_cast<std::int64_t>(n_doc);
  lengths_at_ = kHeaderBytes;
  pointers_at_ = lengths_at_ + 4 * n_seq;
  docs_at_ = pointers_at_ + 8 * n_seq;

  // Sequences back to back from byte 0; lengths non-negative.
  std::int64_t bytes = 0;
  const auto esz = static_cast<std::int64_t>(elem_);
  for (std::int64_t s = 0; s < num_seq_; ++s) {
    const std::int32_t len = sequence_length(s);
    const std::int64_t ptr = sequence_pointer(s);
    TRIDENT_REQUIRE(len >= 0, where << ": sequence " << s << " has negative length " << len);
    TRIDENT_REQUIRE(ptr == bytes, where << ": sequence " << s << " starts at byte " << ptr << ", expected " << bytes
                                        << " (the sequence lengths and pointers do not add up)");
    bytes += len * esz;
  }
  // Document indices: from 0, non-decreasing, ending at the sequence count.
  TRIDENT_REQUIRE(document_index(0) == 0,
                  where << ": the document indices start at " << document_index(0) << ", not 0");
  for (std::int64_t d = 1; d < num_doc_idx_; ++d)
    TRIDENT_REQUIRE(document_index(d) >= document_index(d - 1), where << ": document index " << d << " decreases ("
                                                                      << document_index(d - 1) << " -> "
                                                                      << document_index(d) << ")");
  TRIDENT_REQUIRE(document_index(num_doc_idx_ - 1) == num_seq_,
                  where << ": the last document index is " << document_index(num_doc_idx_ - 1) << ", but there are "
                        << num_seq_ << " sequences");
  num_tokens_ = bytes / esz;

  fd_ = ::open(bin.c_str(), O_RDONLY | O_CLOEXEC);
  TRIDENT_REQUIRE(fd_ >= 0, "Megatron data file '" << bin << "': cannot open: " << std::strerror(errno));
  struct stat st {};
  TRIDENT_REQUIRE(::fstat(fd_, &st) == 0, "Megatron data file '" << bin << "': cannot stat: " << std::strerror(errno));
  TRIDENT_REQUIRE(st.st_size == bytes, "Megatron data file '"
                                           << bin << "': " << st.st_size << " bytes, but its index '" << idx
                                           << "' describes " << bytes << " ("
                                           << (st.st_size < bytes ? "truncated" : "longer than indexed") << ")");
}

IndexedDatasetReader::~IndexedDatasetReader() {
  if (fd_ >= 0) ::close(fd_);
}

void IndexedDatasetReader::read(std::int64_t begin, std::int64_t count, std::int32_t* out) const {
  TRIDENT_REQUIRE(begin >= 0 && count >= 0 && begin <= num_tokens_ && count <= num_tokens_ - begin,
                  "Megatron data file '" << bin_path() << "': token range [" << begin << ", " << begin + count
                                         << ") outside [0, " << num_tokens_ << ")");
  constexpr std::int64_t kBlock = 1 << 13;  // tokens per pread (64 KiB of int64 at most, on the stack)
  unsigned char buf[kBlock * 8];
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t n = std::min(kBlock, count - done);
    const std::size_t want = static_cast<std::size_t>(n) * elem_;
    std::size_t got = 0;
    const off_t at = static_cast<off_t>((begin + done) * static_cast<std::int64_t>(elem_));
    while (got < want) {
      const ssize_t r = ::pread(fd_, buf + got, want - got, at + static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      TRIDENT_REQUIRE(r > 0, "Megatron data file '"
                                 << bin_path() << "': cannot read tokens [" << begin + done << ", " << begin + done + n
                                 << "): " << (r == 0 ? "end of file (truncated?)" : std::strerror(errno)));
      got += static_cast<std::size_t>(r);
    }
    if (dtype_ == 4) {
      std::memcpy(out + done, buf, want);
    } else if (dtype_ == 8) {
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, buf + 2 * i, 2);
        out[done + i] = v;
      }
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t v = element(buf + static_cast<std::size_t>(i) * elem_, dtype_);
        TRIDENT_REQUIRE(v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max(),
                        "Megatron data file '" << bin_path() << "': token " << v << " at position " << begin + done + i
                                               << " does not fit int32");
        out[done + i] = static_cast<std::int32_t>(v);
      }
    }
    done += n;
  }
}

// ------------------------------------------------------------------------------------------
// Writer
// ------------------------------------------------------------------------------------------

struct IndexedDatasetWriter::Impl {
  std::string prefix;
  IndexedDtype dtype;
  std::size_t elem = 0;
  std::FILE* bin = nullptr;
  bool closed = false;
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> docs{0};
  std::vector<unsigned char> buf;

  std::string bin_tmp() const { return prefix + ".bin.tmp"; }
  std::string idx_tmp() const { return prefix + ".idx.tmp"; }
  void abandon() {
    if (bin) std::fclose(bin);
    bin = nullptr;
    std::error_code ec;
    std::filesystem::remove(bin_tmp(), ec);
    std::filesystem::remove(idx_tmp(), ec);
  }
};

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, IndexedDtype dtype)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.prefix = prefix;
  m.dtype = dtype;
  m.elem = indexed_dtype_size(static_cast<int>(dtype));
  TRIDENT_REQUIRE(m.elem > 0 && dtype != IndexedDtype::float32 && dtype != IndexedDtype::float64,
                  "Megatron writer '" << prefix << "': dtype code " << static_cast<int>(dtype)
                                      << " is not an integer type");
  m.bin = std::fopen(m.bin_tmp().c_str(), "wb");
  TRIDENT_REQUIRE(m.bin, "Megatron writer: cannot create '" << m.bin_tmp() << "': " << std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (impl_ && !impl_->closed) impl_->abandon();
}

void IndexedDatasetWriter::add_document(const std::vector<std::int32_t>& tokens,
                                        const std::vector<std::int64_t>& sequence_ends) {
  Impl& m = *impl_;
  TRIDENT_REQUIRE(!m.closed, "Megatron writer '" << m.prefix << "': add_document after close()");
  const auto n = static_cast<std::int64_t>(tokens.size());
  std::int64_t lo = 0, hi = 0;
  switch (m.dtype) {
    case IndexedDtype::uint8: hi = 255; break;
    case IndexedDtype::int8:
      lo = -128;
      hi = 127;
      break;
    case IndexedDtype::int16:
      lo = -32768;
      hi = 32767;
      break;
    case IndexedDtype::uint16: hi = 65535; break;
    default: lo = std::numeric_limits<std::int32_t>::min(); hi = std::numeric_limits<std::int32_t>::max();
  }
  m.buf.resize(tokens.size() * m.elem);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int64_t v = tokens[i];
    TRIDENT_REQUIRE(v >= lo && v <= hi, "Megatron writer '" << m.prefix << "': token " << v << " does not fit "
                                                            << indexed_dtype_name(static_cast<int>(m.dtype)));
    unsigned char* p = m.buf.data() + i * m.elem;
    switch (m.dtype) {
      case IndexedDtype::uint8:
      case IndexedDtype::int8: *p = static_cast<unsigned char>(v); break;
      case IndexedDtype::int16:
      case IndexedDtype::uint16: {
        const auto u = static_cast<std::uint16_t>(v);
        std::memcpy(p, &u, 2);
        break;
      }
      case IndexedDtype::int32: {
        const auto u = static_cast<std::int32_t>(v);
        std::memcpy(p, &u, 4);
        break;
      }
      default: {
        std::memcpy(p, &v, 8);
        break;
      }
    }
  }
  std::vector<std::int64_t> ends = sequence_ends;
  if (ends.empty() && n > 0) ends.push_back(n);
  std::int64_t prev = 0;
  for (std::int64_t e : ends) {
    TRIDENT_REQUIRE(e > prev && e <= n && e - prev <= std::numeric_limits<std::int32_t>::max(),
                    "Megatron writer '" << m.prefix << "': sequence end " << e << " of a document of " << n
                                        << " tokens must increase strictly within (0, " << n
                                        << "], sequences at most 2^31-1 tokens");
    m.lengths.push_back(static_cast<std::int32_t>(e - prev));
    prev = e;
  }
  TRIDENT_REQUIRE(prev == n, "Megatron writer '" << m.prefix << "': the last sequence end (" << prev
                                                 << ") must equal the document length (" << n << ")");
  if (!m.buf.empty())
    TRIDENT_REQUIRE(std::fwrite(m.buf.data(), 1, m.buf.size(), m.bin) == m.buf.size(),
                    "Megatron writer: cannot write '" << m.bin_tmp() << "' (disk full?)");
  m.docs.push_back(static_cast<std::int64_t>(m.lengths.size()));
}

void IndexedDatasetWriter::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  const bool flushed = std::fflush(m.bin) == 0 && ::fsync(::fileno(m.bin)) == 0;
  std::fclose(m.bin);
  m.bin = nullptr;
  TRIDENT_REQUIRE(flushed, "Megatron writer: cannot flush '" << m.bin_tmp() << "' (disk full?)");
  {
    std::ofstream idx(m.idx_tmp(), std::ios::binary | std::ios::trunc);
    TRIDENT_REQUIRE(idx, "Megatron writer: cannot create '" << m.idx_tmp() << "'");
    auto put = [&](const void* p, std::size_t n) {
      idx.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    };
    const std::uint64_t version = 1, n_seq = m.lengths.size(), n_doc = m.docs.size();
    const auto code = static_cast<std::uint8_t>(m.dtype);
    put(kMagic, 9);
    put(&version, 8);
    put(&code, 1);
    put(&n_seq, 8);
    put(&n_doc, 8);
    put(m.lengths.data(), 4 * m.lengths.size());
    std::vector<std::int64_t> pointers(m.lengths.size());
    std::int64_t at = 0;
    for (std::size_t s = 0; s < m.lengths.size(); ++s) {
      pointers[s] = at;
      at += static_cast<std::int64_t>(m.lengths[s]) * static_cast<std::int64_t>(m.elem);
    }
    put(pointers.data(), 8 * pointers.size());
    put(m.docs.data(), 8 * m.docs.size());
    idx.flush();
    TRIDENT_REQUIRE(idx, "Megatron writer: cannot write '" << m.idx_tmp() << "' (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(m.bin_tmp(), m.prefix + ".bin", ec);
  TRIDENT_REQUIRE(!ec, "Megatron writer: cannot rename '" << m.bin_tmp() << "': " << ec.message());
  std::filesystem::rename(m.idx_tmp(), m.prefix + ".idx", ec);
  TRIDENT_REQUIRE(!ec, "Megatron writer: cannot rename '" << m.idx_tmp() << "': " << ec.message());
  m.closed = true;
}

}  // namespace trident
