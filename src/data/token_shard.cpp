// Token shard writer and reader (format: token_shard.hpp / docs/DESIGN.md "Token shards").
// The writer keeps at most kFlushTokens tokens in memory: /tokens is an extendible chunked
// dataset grown by one hyperslab write per flush. Offsets (8 bytes per document / sentence)
// stay in memory until close(). The reader validates the whole structure on open so that a
// training job fails at start-up, naming the file, rather than mid-run.
#include "data/token_shard.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <filesystem>
#include <limits>
#include <sstream>

#include "common/error.hpp"
#include "data/indexed_dataset.hpp"

namespace trident {

namespace {

constexpr hsize_t kTokenChunk = kTokenShardChunk;           // elements per chunk of /tokens
constexpr std::size_t kFlushTokens = std::size_t(1) << 20;  // buffered tokens before a write

std::string where_of(const std::string& path) { return "token shard '" + path + "'"; }

// Writes a 1-D int64 dataset in one go.
void write_int64_dataset(hid_t file, const char* name, const std::vector<std::int64_t>& v, const std::string& path) {
  const hsize_t dims[1] = {static_cast<hsize_t>(v.size())};
  H5Handle space = h5_space(H5Screate_simple(1, dims, nullptr));
  H5Handle ds = h5_dataset(H5Dcreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(ds.valid(), where_of(path) << ": cannot create dataset " << name);
  if (!v.empty()) {
    TRIDENT_REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0,
                    where_of(path) << ": cannot write dataset " << name);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Writer
// ------------------------------------------------------------------------------------------

namespace {
constexpr int kNumSpecial = 8;
const char* const kSpecialAttrs[kNumSpecial] = {"cls_id", "sep_id", "mask_id",     "pad_id",
                                                "bos_id", "eos_id", "sentinel_id", "num_sentinels"};
// the fields of SpecialTokens stored under those names
std::int32_t* special_fields(SpecialTokens& s, int i) {
  std::int32_t* f[kNumSpecial] = {&s.cls, &s.sep, &s.mask, &s.pad, &s.bos, &s.eos, &s.sentinel, &s.num_sentinels};
  return f[i];
}
}  // namespace

struct TokenShardWriter::Impl {
  std::string path, tmp_path;
  std::int64_t vocab_size = 0;
  std::int64_t eod_id = -1;
  SpecialTokens specials;
  std::string tokenizer, tokenizer_digest;
  bool with_sentences = false;
  bool closed = false;
  bool wide = false;  // int32 tokens (else uint16)
  H5Handle file, tokens;
  std::vector<std::int32_t> buffer;  // (< kFlushTokens) tokens not yet written to the file
  std::int64_t written = 0;          // tokens already in the file
  std::int64_t max_token_id = -1;
  std::vector<std::int64_t> doc_offsets{0};   // (documents + 1) so far
  std::vector<std::int64_t> sent_offsets{0};  // (sentences + 1) so far (with_sentences only)

  std::int64_t total() const { return written + static_cast<std::int64_t>(buffer.size()); }

  void flush() {
    if (buffer.empty()) return;
    H5QuietErrors quiet;
    const hsize_t new_size[1] = {static_cast<hsize_t>(written + buffer.size())};
    TRIDENT_REQUIRE(H5Dset_extent(tokens, new_size) >= 0, where_of(tmp_path) << ": cannot extend /tokens");
    H5Handle fspace = h5_space(H5Dget_space(tokens));
    const hsize_t start[1] = {static_cast<hsize_t>(written)};
    const hsize_t count[1] = {static_cast<hsize_t>(buffer.size())};
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
    H5Handle mspace = h5_space(H5Screate_simple(1, count, nullptr));
    // HDF5 converts the int32 buffer to the file type (uint16 or int32); values were
    // range-checked in add_document.
    TRIDENT_REQUIRE(H5Dwrite(tokens, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, buffer.data()) >= 0,
                    where_of(tmp_path) << ": cannot write tokens (disk full?)");
    written += static_cast<std::int64_t>(buffer.size());
    buffer.clear();
  }
};

TokenShardWriter::TokenShardWriter(const std::string& path, const std::string& tokenizer, std::int64_t vocab_size,
                                   std::int64_t eod_id, bool with_sentences)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TRIDENT_REQUIRE(vocab_size > 0 && vocab_size <= std::int64_t(std::numeric_limits<std::int32_t>::max()) + 1,
                  where_of(path) << ": vocab_size " << vocab_size << " out of range");
  TRIDENT_REQUIRE(eod_id >= -1 && eod_id < vocab_size, where_of(path)
                                                           << ": eod_id " << eod_id << " outside [-1, vocab_size)");
  m.path = path;
  m.tmp_path = path + ".tmp";
  m.tokenizer = tokenizer;
  m.vocab_size = vocab_size;
  m.eod_id = eod_id;
  m.with_sentences = with_sentences;
  m.wide = vocab_size > 65536;
  m.buffer.reserve(kFlushTokens);

  H5QuietErrors quiet;
  // Serial (default) file access: each rank writes its own shard.
  m.file = h5_file(H5Fcreate(m.tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(m.file.valid(), where_of(path) << ": cannot create '" << m.tmp_path
                                                 << "' (does the directory exist and is it writable?)");
  const hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {kTokenChunk};
  H5Handle space = h5_space(H5Screate_simple(1, dims, maxdims));
  H5Handle dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl, 1, chunk);
  H5Pset_fletcher32(dcpl);  // a checksum per chunk, verified by HDF5 on every read
  m.tokens = h5_dataset(
      H5Dcreate2(m.file, "tokens", m.wide ? H5T_STD_I32LE : H5T_STD_U16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  if (!m.tokens.valid()) {
    m.file.reset();
    std::error_code ec;
    std::filesystem::remove(m.tmp_path, ec);
    throw Error::all(where_of(path) + ": cannot create dataset /tokens");
  }
}

TokenShardWriter::~TokenShardWriter() {
  if (!impl_ || impl_->closed) return;
  // Abandoned: drop the partial file.
  impl_->tokens.reset();
  impl_->file.reset();
  std::error_code ec;
  std::filesystem::remove(impl_->tmp_path, ec);
}

void TokenShardWriter::add_document(const std::vector<std::int32_t>& tokens,
                                    const std::vector<std::int64_t>& sentence_ends) {
  Impl& m = *impl_;
  TRIDENT_REQUIRE(!m.closed, where_of(m.path) << ": add_document after close()");
  const auto n = static_cast<std::int64_t>(tokens.size());
  for (std::int32_t t : tokens) {
    TRIDENT_REQUIRE(t >= 0 && t < m.vocab_size,
                    where_of(m.path) << ": token id " << t << " outside [0, vocab_size=" << m.vocab_size << ")");
    m.max_token_id = std::max<std::int64_t>(m.max_token_id, t);
  }
  const std::int64_t base = m.total();
  if (m.with_sentences) {
    // Ends strictly increasing, the last one closing the document; none given = one sentence.
    std::int64_t prev = 0;
    for (std::size_t k = 0; k < sentence_ends.size(); ++k) {
      const std::int64_t e = sentence_ends[k];
      TRIDENT_REQUIRE(e > prev && e <= n, where_of(m.path) << ": sentence end " << e << " of a document of " << n
                                                           << " tokens must increase strictly within (0, " << n << "]");
      prev = e;
    }
    TRIDENT_REQUIRE(sentence_ends.empty() || prev == n, where_of(m.path)
                                                            << ": the last sentence end (" << prev
                                                            << ") must equal the document length (" << n << ")");
    if (sentence_ends.empty()) {
      if (n > 0) m.sent_offsets.push_back(base + n);
    } else {
      for (std::int64_t e : sentence_ends) m.sent_offsets.push_back(base + e);
    }
  } else {
    TRIDENT_REQUIRE(sentence_ends.empty(), where_of(m.path) << ": sentence ends given to a writer without sentences");
  }
  // Append, flushing whenever the buffer is full (bounded memory even for huge documents).
  std::size_t pos = 0;
  while (pos < tokens.size()) {
    const std::size_t take = std::min(tokens.size() - pos, kFlushTokens - m.buffer.size());
    m.buffer.insert(m.buffer.end(), tokens.begin() + pos, tokens.begin() + pos + take);
    pos += take;
    if (m.buffer.size() >= kFlushTokens) m.flush();
  }
  m.doc_offsets.push_back(base + n);
}

std::int64_t TokenShardWriter::num_tokens() const { return impl_->total(); }
std::int64_t TokenShardWriter::num_documents() const {
  return static_cast<std::int64_t>(impl_->doc_offsets.size()) - 1;
}

void TokenShardWriter::set_tokenizer_digest(const std::string& digest) { impl_->tokenizer_digest = digest; }

void TokenShardWriter::set_special_tokens(const SpecialTokens& specials) {
  Impl& m = *impl_;
  SpecialTokens sp = specials;
  for (int i = 0; i < kNumSpecial; ++i) {
    const std::int64_t v = *special_fields(sp, i);
    TRIDENT_REQUIRE(v >= -1 && v < m.vocab_size,
                    where_of(m.path) << ": " << kSpecialAttrs[i] << " " << v << " outside [-1, vocab_size)");
  }
  TRIDENT_REQUIRE(sp.num_sentinels == 0 || (sp.sentinel >= 0 && sp.sentinel + sp.num_sentinels <= m.vocab_size),
                  where_of(m.path) << ": sentinel tokens [" << sp.sentinel << ", " << sp.sentinel + sp.num_sentinels
                                   << ") outside the vocabulary");
  m.specials = sp;
}

void TokenShardWriter::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  m.flush();
  {
    H5QuietErrors quiet;
    write_int64_dataset(m.file, "document_offsets", m.doc_offsets, m.tmp_path);
    if (m.with_sentences) write_int64_dataset(m.file, "sentence_offsets", m.sent_offsets, m.tmp_path);
    h5_write_attr(m.file, "format", std::string(kTokenShardFormat));
    h5_write_attr(m.file, "format_version", kTokenShardVersion);
    h5_write_attr(m.file, "tokenizer", m.tokenizer);
    h5_write_attr(m.file, "tokenizer_digest", m.tokenizer_digest);
    h5_write_attr(m.file, "vocab_size", m.vocab_size);
    h5_write_attr(m.file, "eod_id", m.eod_id);
    h5_write_attr(m.file, "max_token_id", m.max_token_id);
    for (int i = 0; i < kNumSpecial; ++i) {
      const std::int64_t v = *special_fields(m.specials, i);
      if (v > 0 || (v == 0 && i != kNumSpecial - 1)) h5_write_attr(m.file, kSpecialAttrs[i], v);
    }
    m.tokens.reset();
    TRIDENT_REQUIRE(H5Fflush(m.file, H5F_SCOPE_GLOBAL) >= 0, where_of(m.path)
                                                                 << ": cannot flush '" << m.tmp_path << "'");
    m.file.reset();
  }
  std::error_code ec;
  std::filesystem::rename(m.tmp_path, m.path, ec);
  TRIDENT_REQUIRE(!ec, where_of(m.path) << ": cannot rename '" << m.tmp_path << "' to it: " << ec.message());
  m.closed = true;
}

// ------------------------------------------------------------------------------------------
// Reader
// ------------------------------------------------------------------------------------------

struct TokenShardReader::Impl {
  TokenShardMeta meta;
  H5Handle file, tokens;
  std::unique_ptr<IndexedDatasetReader> indexed;  // a Megatron pair (then file/tokens unused)
  std::string stat_path;                          // the file whose changes are watched (.bin of a pair)
  MappedFile map;                                 // the shard file, for its offset datasets
  std::vector<std::int64_t> doc_heap, sent_heap;  // offsets that could not be mapped
  OffsetList doc_offsets, sent_offsets;           // (num_documents + 1), (sentences + 1) or empty
  struct stat opened {};                          // the file as opened
  mutable std::atomic<bool> touched{false};       // read since the last check_touched_shards()
  std::string changes() const;                    // TokenShardReader::changed_on_disk
  Impl();
  ~Impl();
};

namespace {
// every open reader of this process, for check_touched_shards()
std::mutex g_readers_mutex;
std::set<const TokenShardReader::Impl*> g_readers;
}  // namespace

TokenShardReader::Impl::Impl() {
  std::lock_guard<std::mutex> lock(g_readers_mutex);
  g_readers.insert(this);
}
TokenShardReader::Impl::~Impl() {
  std::lock_guard<std::mutex> lock(g_readers_mutex);
  g_readers.erase(this);
}

namespace {

// Opens a 1-D integer dataset, or throws naming the problem.
H5Handle open_1d_integer(hid_t file, const char* name, const std::string& where, hsize_t& length) {
  TRIDENT_REQUIRE(H5Lexists(file, name, H5P_DEFAULT) > 0, where << ": missing dataset /" << name);
  // a small chunk cache (the default is 1 MB per dataset): reads of a shuffled dataset rarely
  // return to a chunk, and a job holds many shards open
  H5Handle dapl = h5_plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl, 101, 256 << 10, 0.75);
  H5Handle ds = h5_dataset(H5Dopen2(file, name, dapl));
  TRIDENT_REQUIRE(ds.valid(), where << ": cannot open dataset /" << name);
  H5Handle type = h5_type(H5Dget_type(ds));
  TRIDENT_REQUIRE(H5Tget_class(type) == H5T_INTEGER, where << ": dataset /" << name << " is not of an integer type");
  const std::vector<hsize_t> dims = h5_dims(ds);
  TRIDENT_REQUIRE(dims.size() == 1,
                  where << ": dataset /" << name << " must be 1-D, has " << dims.size() << " dimensions");
  length = dims[0];
  return ds;
}

// An int64 offsets dataset: mapped from the file when it is stored contiguous as little-endian
// int64 (as TokenShardWriter writes it), else read into `heap`.
OffsetList read_offsets(TokenShardReader::Impl& m, const char* name, const std::string& where,
                        std::vector<std::int64_t>& heap) {
  hsize_t n = 0;
  H5Handle ds = open_1d_integer(m.file, name, where, n);
  if (n == 0) return OffsetList();
  H5Handle type = h5_type(H5Dget_type(ds));
  H5Handle dcpl = h5_plist(H5Dget_create_plist(ds));
  const haddr_t at = H5Dget_offset(ds);
  if (H5Tequal(type, H5T_STD_I64LE) > 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && at != HADDR_UNDEF) {
    if (!m.map.data()) m.map = MappedFile(m.meta.path);
    if (at + 8 * n <= m.map.size()) return OffsetList::array(m.map.data() + at, static_cast<std::int64_t>(n));
  }
  heap.resize(n);
  TRIDENT_REQUIRE(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, heap.data()) >= 0,
                  where << ": cannot read dataset /" << name);
  return OffsetList::array(reinterpret_cast<const unsigned char*>(heap.data()), static_cast<std::int64_t>(n));
}

// Offsets must start at 0, never decrease and end at the number of tokens.
// strict: every entry above the one before (sentences are never empty); otherwise
// non-decreasing (an empty document is allowed).
void check_offsets(const OffsetList& v, const char* name, std::int64_t num_tokens, const std::string& where,
                   bool strict) {
  TRIDENT_REQUIRE(!v.empty(), where << ": /" << name << " is empty (needs at least the leading 0)");
  TRIDENT_REQUIRE(v[0] == 0, where << ": /" << name << " must start at 0, starts at " << v[0]);
  std::int64_t prev = 0;
  for (std::int64_t k = 1; k < v.size(); ++k) {
    const std::int64_t x = v[k];
    TRIDENT_REQUIRE(x >= prev,
                    where << ": /" << name << " decreases at entry " << k << " (" << prev << " -> " << x << ")");
    TRIDENT_REQUIRE(!strict || x > prev, where << ": /" << name << " repeats offset " << x << " at entry " << k
                                               << " (an empty sentence; the offsets must increase)");
    prev = x;
  }
  TRIDENT_REQUIRE(v.back() == num_tokens, where << ": /" << name << " ends at " << v.back() << " but /tokens holds "
                                                << num_tokens << " tokens");
}

}  // namespace

namespace {

// The Megatron pair `prefix` described by `d` (the deck's tokenizer).
void open_indexed(TokenShardReader::Impl& m, const std::string& prefix, const TokenShardMeta* d) {
  const std::string where = "Megatron indexed dataset '" + prefix + "'";
  TRIDENT_REQUIRE(d, where << ": a Megatron index records no tokenizer; set data.tokenizer_type (with "
                           << "data.vocab_file, data.merges_file and data.vocab_extra_ids as for preprocess_data)");
  m.indexed = std::make_unique<IndexedDatasetReader>(prefix);
  const IndexedDatasetReader& r = *m.indexed;
  m.meta.path = prefix;
  m.meta.format = kIndexedFormat;
  m.meta.format_version = 1;
  m.meta.tokenizer = d->tokenizer;
  m.meta.tokenizer_digest = d->tokenizer_digest;
  m.meta.vocab_size = d->vocab_size;
  m.meta.eod_id = d->eod_id;
  m.meta.specials = d->specials;
  m.meta.num_tokens = r.num_tokens();
  m.meta.num_documents = r.num_documents();
  m.stat_path = r.bin_path();
  TRIDENT_REQUIRE(::stat(m.stat_path.c_str(), &m.opened) == 0, where << ": cannot stat: " << std::strerror(errno));
  m.doc_offsets = OffsetList::megatron_documents(&r);
  bool multi = false;
  for (std::int64_t d = 1; d <= r.num_documents() && !multi; ++d)
    multi = r.document_index(d) - r.document_index(d - 1) > 1;
  const std::string tail = "_sentence";
  const bool named = prefix.size() >= tail.size() &&
                     prefix.compare(prefix.size() - tail.size(), tail.size(), tail) == 0;
  if (multi || named) {
    m.sent_offsets = OffsetList::megatron_sequences(&r);
    m.meta.has_sentences = true;
  }
}

}  // namespace

TokenShardReader::TokenShardReader(const std::string& path, const TokenShardMeta* indexed)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (const std::string prefix = indexed_dataset_prefix(path); !prefix.empty()) {
    open_indexed(m, prefix, indexed);
    return;
  }
  const std::string where = where_of(path);
  m.meta.path = path;
  m.stat_path = path;
  std::error_code ec;
  TRIDENT_REQUIRE(std::filesystem::exists(path, ec), where << ": file does not exist");
  TRIDENT_REQUIRE(std::filesystem::is_regular_file(path, ec), where << ": not a regular file");
  TRIDENT_REQUIRE(::stat(path.c_str(), &m.opened) == 0, where << ": cannot stat: " << std::strerror(errno));
  H5QuietErrors quiet;
  // A small metadata cache: a job opens many shards, and the default (up to 32 MB per file)
  // grows with the /tokens chunks a shuffled dataset touches (perf/results/data_scale_*.md).
  H5Handle fapl = h5_plist(H5Pcreate(H5P_FILE_ACCESS));
  {
    H5AC_cache_config_t mdc{};
    mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
    if (H5Pget_mdc_config(fapl, &mdc) >= 0) {
      mdc.set_initial_size = true;
      mdc.initial_size = 1 << 20;
      mdc.min_size = 1 << 20;
      mdc.max_size = 2 << 20;
      H5Pset_mdc_config(fapl, &mdc);
    }
  }
  m.file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl));
  TRIDENT_REQUIRE(m.file.valid(), where << ": cannot be opened as an HDF5 file");

  TRIDENT_REQUIRE(h5_has_attr(m.file, "format"), where << ": missing attribute 'format' (not a Trident token shard)");
  const std::string format = h5_read_attr_string(m.file, "format", where);
  TRIDENT_REQUIRE(format == kTokenShardFormat,
                  where << ": attribute 'format' is '" << format << "', expected '" << kTokenShardFormat << "'");
  m.meta.format_version = h5_read_attr_int(m.file, "format_version", where);
  TRIDENT_REQUIRE(m.meta.format_version >= 1 && m.meta.format_version <= kTokenShardVersion,
                  where << ": format_version " << m.meta.format_version << " is not supported (this build reads "
                        << "1.." << kTokenShardVersion << ")");
  m.meta.tokenizer = h5_read_attr_string(m.file, "tokenizer", where);
  if (m.meta.format_version >= 3) {
    TRIDENT_REQUIRE(h5_has_attr(m.file, "tokenizer_digest"),
                    where << ": missing attribute 'tokenizer_digest' (format_version " << m.meta.format_version << ")");
    m.meta.tokenizer_digest = h5_read_attr_string(m.file, "tokenizer_digest", where);
  }
  m.meta.vocab_size = h5_read_attr_int(m.file, "vocab_size", where);
  TRIDENT_REQUIRE(m.meta.vocab_size > 0,
                  where << ": attribute 'vocab_size' must be positive, is " << m.meta.vocab_size);
  m.meta.eod_id = h5_read_attr_int(m.file, "eod_id", where);
  TRIDENT_REQUIRE(m.meta.eod_id >= -1 && m.meta.eod_id < m.meta.vocab_size,
                  where << ": attribute 'eod_id' " << m.meta.eod_id << " outside [-1, vocab_size)");
  for (int i = 0; i < kNumSpecial; ++i) {
    if (!h5_has_attr(m.file, kSpecialAttrs[i])) continue;
    const std::int64_t v = h5_read_attr_int(m.file, kSpecialAttrs[i], where);
    TRIDENT_REQUIRE(v >= 0 && v < m.meta.vocab_size,
                    where << ": attribute '" << kSpecialAttrs[i] << "' " << v << " outside [0, vocab_size)");
    *special_fields(m.meta.specials, i) = static_cast<std::int32_t>(v);
  }
  const SpecialTokens& sp = m.meta.specials;
  TRIDENT_REQUIRE(sp.num_sentinels == 0 || (sp.sentinel >= 0 && sp.sentinel + sp.num_sentinels <= m.meta.vocab_size),
                  where << ": sentinel tokens [" << sp.sentinel << ", " << sp.sentinel + sp.num_sentinels
                        << ") outside the vocabulary");

  hsize_t n_tokens = 0;
  m.tokens = open_1d_integer(m.file, "tokens", where, n_tokens);
  {
    H5Handle type = h5_type(H5Dget_type(m.tokens));
    const std::size_t size = H5Tget_size(type);
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    TRIDENT_REQUIRE(size < 4 || (size == 4 && is_signed), where << ": /tokens has an integer type of " << size
                                                                << " bytes" << (is_signed ? "" : " (unsigned)")
                                                                << "; expected uint16 or int32");
  }
  m.meta.num_tokens = static_cast<std::int64_t>(n_tokens);
  if (m.meta.format_version >= 2) {
    TRIDENT_REQUIRE(h5_has_attr(m.file, "max_token_id"),
                    where << ": missing attribute 'max_token_id' (format_version " << m.meta.format_version << ")");
    m.meta.max_token_id = h5_read_attr_int(m.file, "max_token_id", where);
  } else {  // version 1 records no maximum: the tokens are read once, here
    std::vector<std::int32_t> block;
    for (std::int64_t b = 0; b < m.meta.num_tokens; b += std::int64_t(1) << 20) {
      const std::int64_t n = std::min<std::int64_t>(std::int64_t(1) << 20, m.meta.num_tokens - b);
      block.resize(static_cast<std::size_t>(n));
      H5Handle fspace = h5_space(H5Dget_space(m.tokens));
      const hsize_t start[1] = {static_cast<hsize_t>(b)}, cnt[1] = {static_cast<hsize_t>(n)};
      H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr);
      H5Handle mspace = h5_space(H5Screate_simple(1, cnt, nullptr));
      TRIDENT_REQUIRE(H5Dread(m.tokens, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, block.data()) >= 0,
                      where << ": cannot read tokens [" << b << ", " << b + n << ")");
      for (std::int32_t t : block) {
        TRIDENT_REQUIRE(t >= 0, where << ": negative token id " << t << " at position " << b);
        m.meta.max_token_id = std::max<std::int64_t>(m.meta.max_token_id, t);
      }
    }
  }
  TRIDENT_REQUIRE(m.meta.max_token_id < m.meta.vocab_size, where << ": holds token id " << m.meta.max_token_id
                                                                 << ", outside its vocabulary (vocab_size "
                                                                 << m.meta.vocab_size << ")");

  m.doc_offsets = read_offsets(m, "document_offsets", where, m.doc_heap);
  guarded_map_read(where, [&] { check_offsets(m.doc_offsets, "document_offsets", m.meta.num_tokens, where, false); });
  m.meta.num_documents = m.doc_offsets.size() - 1;

  if (H5Lexists(m.file, "sentence_offsets", H5P_DEFAULT) > 0) {
    m.sent_offsets = read_offsets(m, "sentence_offsets", where, m.sent_heap);
    guarded_map_read(where, [&] {
      check_offsets(m.sent_offsets, "sentence_offsets", m.meta.num_tokens, where, true);
      // Every document boundary is a sentence boundary.
      std::int64_t s = 0;
      for (std::int64_t d = 0; d < m.doc_offsets.size(); ++d) {
        const std::int64_t b = m.doc_offsets[d];
        while (s < m.sent_offsets.size() && m.sent_offsets[s] < b) ++s;
        TRIDENT_REQUIRE(s < m.sent_offsets.size() && m.sent_offsets[s] == b,
                        where << ": document boundary " << b << " (document " << d
                              << ") is missing from /sentence_offsets");
      }
    });
    m.meta.has_sentences = true;
  }
}

TokenShardReader::~TokenShardReader() = default;
TokenShardReader::TokenShardReader(TokenShardReader&&) noexcept = default;
TokenShardReader& TokenShardReader::operator=(TokenShardReader&&) noexcept = default;

const TokenShardMeta& TokenShardReader::meta() const { return impl_->meta; }
const OffsetList& TokenShardReader::document_offsets() const { return impl_->doc_offsets; }
const OffsetList& TokenShardReader::sentence_offsets() const { return impl_->sent_offsets; }

OffsetList OffsetList::array(const unsigned char* bytes, std::int64_t n) {
  OffsetList l;
  l.bytes_ = bytes;
  l.n_ = n;
  return l;
}
OffsetList OffsetList::megatron_documents(const IndexedDatasetReader* r) {
  OffsetList l;
  l.kind_ = Kind::documents;
  l.megatron_ = r;
  l.n_ = r->num_documents() + 1;
  return l;
}
OffsetList OffsetList::megatron_sequences(const IndexedDatasetReader* r) {
  OffsetList l;
  l.kind_ = Kind::sequences;
  l.megatron_ = r;
  l.n_ = r->num_sequences() + 1;
  return l;
}
std::int64_t OffsetList::operator[](std::int64_t i) const {
  switch (kind_) {
    case Kind::documents: return megatron_->sequence_start(megatron_->document_index(i));
    case Kind::sequences: return megatron_->sequence_start(i);
    default: {
      std::int64_t v;
      std::memcpy(&v, bytes_ + 8 * i, 8);
      return v;
    }
  }
}
std::vector<std::int64_t> OffsetList::to_vector() const {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n_));
  for (std::int64_t i = 0; i < n_; ++i) v[static_cast<std::size_t>(i)] = (*this)[i];
  return v;
}

void TokenShardReader::read(std::int64_t begin, std::int64_t count, std::int32_t* out) const {
  const Impl& m = *impl_;
  TRIDENT_REQUIRE(begin >= 0 && count >= 0 && begin <= m.meta.num_tokens && count <= m.meta.num_tokens - begin,
                  where_of(m.meta.path) << ": token range [" << begin << ", " << begin + count << ") outside [0, "
                                        << m.meta.num_tokens << ")");
  if (count == 0) return;
  if (m.indexed) {
    m.touched = true;
    m.indexed->read(begin, count, out);
  } else {
    H5QuietErrors quiet;
    H5Handle fspace = h5_space(H5Dget_space(m.tokens));
    const hsize_t start[1] = {static_cast<hsize_t>(begin)};
    const hsize_t cnt[1] = {static_cast<hsize_t>(count)};
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, cnt, nullptr);
    H5Handle mspace = h5_space(H5Screate_simple(1, cnt, nullptr));
    m.touched = true;
    TRIDENT_REQUIRE(H5Dread(m.tokens, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, out) >= 0,
                    where_of(m.meta.path)
                        << ": cannot read tokens [" << begin << ", " << begin + count
                        << ") (a chunk fails its checksum, or the file changed: " << changed_on_disk() << ")");
  }
  const std::uint32_t vocab = static_cast<std::uint32_t>(m.meta.vocab_size);
  for (std::int64_t i = 0; i < count; ++i)
    if (static_cast<std::uint32_t>(out[i]) >= vocab)
      throw Error::all(where_of(m.meta.path) + ": token id " + std::to_string(out[i]) + " at position " +
                       std::to_string(begin + i) + " is outside the vocabulary (vocab_size " +
                       std::to_string(m.meta.vocab_size) + "): the file is corrupt or changed");
}

std::string TokenShardReader::Impl::changes() const {
  const Impl& m = *this;
  struct stat now {};
  if (::stat(m.stat_path.c_str(), &now) != 0) return std::string("it is gone (") + std::strerror(errno) + ")";
  std::ostringstream os;
  if (now.st_ino != m.opened.st_ino || now.st_dev != m.opened.st_dev)
    os << "it was replaced by another file";
  else if (now.st_size != m.opened.st_size)
    os << "its size changed from " << m.opened.st_size << " to " << now.st_size << " bytes";
  else if (now.st_mtim.tv_sec != m.opened.st_mtim.tv_sec || now.st_mtim.tv_nsec != m.opened.st_mtim.tv_nsec)
    os << "it was modified";
  return os.str();
}

std::string TokenShardReader::changed_on_disk() const { return impl_->changes(); }

std::string TokenShardReader::check_touched_shards() {
  std::vector<const Impl*> touched;
  {
    std::lock_guard<std::mutex> lock(g_readers_mutex);
    for (const Impl* r : g_readers)
      if (r->touched.exchange(false)) touched.push_back(r);
  }
  std::string out;
  for (const Impl* r : touched) {
    const std::string c = r->changes();
    if (!c.empty()) out += (out.empty() ? "" : "; ") + where_of(r->meta.path) + " changed while the job reads it: " + c;
  }
  return out;
}

}  // namespace trident
