// Streaming decoders behind DecodedReader (compressed_input.hpp): the compressed file is read in
// 1 MiB blocks with fread and fed to ZSTD_decompressStream, inflate (gzip, several members
// allowed) or lzma_code (xz, LZMA_CONCATENATED).
#include "data/compressed_input.hpp"

#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/error.hpp"

namespace trident {

namespace {

bool ends_with(const std::string& s, const char* tail) {
  const std::size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

constexpr std::size_t kBlock = std::size_t(1) << 20;

}  // namespace

Compression compression_of(const std::string& path) {
  if (ends_with(path, ".zst") || ends_with(path, ".zstd")) return Compression::zstd;
  if (ends_with(path, ".gz")) return Compression::gzip;
  if (ends_with(path, ".xz")) return Compression::xz;
  return Compression::none;
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::zstd: return "zstd";
    case Compression::gzip: return "gzip";
    case Compression::xz: return "xz";
    default: return "none";
  }
}

std::string without_compression_extension(const std::string& path) {
  for (const char* ext : {".zstd", ".zst", ".gz", ".xz"})
    if (ends_with(path, ext)) return path.substr(0, path.size() - std::strlen(ext));
  return path;
}

struct DecodedReader::Impl {
  std::string path;
  Compression kind = Compression::none;
  std::FILE* fp = nullptr;
  std::vector<unsigned char> in;  // compressed bytes read, [in_pos, in_end) not yet decoded
  std::size_t in_pos = 0, in_end = 0;
  bool file_done = false, stream_done = false;
  std::int64_t out_total = 0;
  ZSTD_DStream* zs = nullptr;
  std::size_t zstd_hint = 0;  // ZSTD_decompressStream's last return
  z_stream gz{};
  bool gz_init = false;
  lzma_stream xz = LZMA_STREAM_INIT;
  bool xz_init = false;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error::one("input file '" + path + "' (" + compression_name(kind) + "): " + what + " at decoded byte " +
                     std::to_string(out_total));
  }
  // Refills the input buffer when it is empty; false at the end of the file.
  bool refill() {
    if (in_pos < in_end) return true;
    if (file_done) return false;
    in_end = std::fread(in.data(), 1, in.size(), fp);
    in_pos = 0;
    if (in_end == 0) {
      if (std::ferror(fp)) fail(std::string("read error: ") + std::strerror(errno));
      file_done = true;
      return false;
    }
    return true;
  }
};

DecodedReader::DecodedReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.kind = compression_of(path);
  m.fp = std::fopen(path.c_str(), "rb");
  if (!m.fp) throw Error::one("cannot open input file '" + path + "': " + std::strerror(errno));
  m.in.resize(kBlock);
  if (m.kind == Compression::none) return;
  // the magic bytes must match the extension
  static const unsigned char zstd_magic[] = {0x28, 0xB5, 0x2F, 0xFD}, gz_magic[] = {0x1F, 0x8B},
                             xz_magic[] = {0xFD, '7', 'z', 'X', 'Z', 0x00};
  const unsigned char* magic = m.kind == Compression::zstd   ? zstd_magic
                               : m.kind == Compression::gzip ? gz_magic
                                                             : xz_magic;
  const std::size_t magic_n = m.kind == Compression::zstd ? 4 : m.kind == Compression::gzip ? 2 : 6;
  m.refill();
  // an empty compressed file is not a valid stream either
  if (m.in_end < magic_n || std::memcmp(m.in.data(), magic, magic_n) != 0)
    m.fail(std::string("not ") + compression_name(m.kind) + " data (the file's first bytes are not its magic)");
  if (m.kind == Compression::zstd) {
    m.zs = ZSTD_createDStream();
    if (!m.zs || ZSTD_isError(ZSTD_initDStream(m.zs))) m.fail("cannot start the zstd decoder");
  } else if (m.kind == Compression::gzip) {
    if (inflateInit2(&m.gz, 15 + 16) != Z_OK) m.fail("cannot start the gzip decoder");
    m.gz_init = true;
  } else {
    if (lzma_stream_decoder(&m.xz, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK) m.fail("cannot start the xz decoder");
    m.xz_init = true;
  }
}

DecodedReader::~DecodedReader() {
  Impl& m = *impl_;
  if (m.zs) ZSTD_freeDStream(m.zs);
  if (m.gz_init) inflateEnd(&m.gz);
  if (m.xz_init) lzma_end(&m.xz);
  if (m.fp) std::fclose(m.fp);
}

std::int64_t DecodedReader::decoded_offset() const { return impl_->out_total; }

std::size_t DecodedReader::read(char* out, std::size_t n) {
  Impl& m = *impl_;
  if (n == 0 || m.stream_done) return 0;
  std::size_t got = 0;
  switch (m.kind) {
    case Compression::none: {
      got = std::fread(out, 1, n, m.fp);
      if (got == 0 && std::ferror(m.fp)) m.fail(std::string("read error: ") + std::strerror(errno));
      if (got == 0) m.stream_done = true;
      break;
    }
    case Compression::zstd: {
      while (got == 0) {
        const bool more = m.refill();  // without more input the decoder may still hold output
        ZSTD_inBuffer ib{m.in.data(), more ? m.in_end : 0, more ? m.in_pos : 0};
        ZSTD_outBuffer ob{out, n, 0};
        const std::size_t hint = ZSTD_decompressStream(m.zs, &ob, &ib);
        if (ZSTD_isError(hint)) m.fail(std::string("corrupt zstd data (") + ZSTD_getErrorName(hint) + ")");
        if (more) m.in_pos = ib.pos;
        got = ob.pos;
        // 0: a frame is complete and its output flushed (a call on no input at a frame boundary
        // asks for the next frame's header: not a truncation)
        if (more || got > 0) m.zstd_hint = hint;
        if (got == 0 && !more) {
          if (m.zstd_hint != 0) m.fail("truncated zstd data (the last frame is incomplete)");
          m.stream_done = true;
          break;
        }
      }
      break;
    }
    case Compression::gzip: {
      const std::size_t cap = std::min<std::size_t>(n, UINT32_MAX);
      while (got == 0) {
        const bool more = m.refill();
        m.gz.next_in = more ? m.in.data() + m.in_pos : nullptr;
        m.gz.avail_in = more ? static_cast<uInt>(m.in_end - m.in_pos) : 0;
        m.gz.next_out = reinterpret_cast<Bytef*>(out);
        m.gz.avail_out = static_cast<uInt>(cap);
        const int rc = inflate(&m.gz, Z_NO_FLUSH);
        if (more) m.in_pos = m.in_end - m.gz.avail_in;
        got = cap - m.gz.avail_out;
        if (rc == Z_STREAM_END) {
          // another member may follow (concatenated gzip files)
          if (m.in_pos == m.in_end && !m.refill()) {
            m.stream_done = true;
            break;
          }
          if (inflateReset(&m.gz) != Z_OK) m.fail("cannot restart the gzip decoder");
        } else if (rc == Z_BUF_ERROR || (rc == Z_OK && !more)) {
          if (!more && got == 0) m.fail("truncated gzip data (the stream ends inside a member)");
        } else if (rc != Z_OK) {
          m.fail(std::string("corrupt gzip data (") + (m.gz.msg ? m.gz.msg : "inflate error") + ")");
        }
      }
      break;
    }
    case Compression::xz: {
      while (got == 0) {
        const bool more = m.refill();
        m.xz.next_in = m.in.data() + m.in_pos;
        m.xz.avail_in = m.in_end - m.in_pos;
        m.xz.next_out = reinterpret_cast<std::uint8_t*>(out);
        m.xz.avail_out = n;
        const lzma_ret rc = lzma_code(&m.xz, more ? LZMA_RUN : LZMA_FINISH);
        m.in_pos = m.in_end - m.xz.avail_in;
        got = n - m.xz.avail_out;
        if (rc == LZMA_STREAM_END) {
          m.stream_done = true;
          break;
        }
        if (rc != LZMA_OK)
          m.fail(rc == LZMA_BUF_ERROR ? "truncated xz data"
                                      : "corrupt xz data (lzma error " + std::to_string(rc) + ")");
        if (!more && got == 0) m.fail("truncated xz data");
      }
      break;
    }
  }
  m.out_total += static_cast<std::int64_t>(got);
  return got;
}

std::int64_t decoded_size(const std::string& path) {
  DecodedReader r(path);
  std::vector<char> buf(kBlock);
  while (r.read(buf.data(), buf.size()) > 0) {
  }
  return r.decoded_offset();
}

}  // namespace trident
