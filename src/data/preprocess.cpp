// preprocess.hpp's per-rank work of preprocess_data, moved here from the app (behaviour unchanged).
#include "data/preprocess.hpp"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "data/jsonl.hpp"
#include "data/sentence_splitter.hpp"

namespace fs = std::filesystem;

namespace trident {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }
}  // namespace

std::vector<std::string> PreprocessOptions::prefixes() const {
  if (json_keys.size() == 1) return {output_prefix};
  std::vector<std::string> out;
  for (const auto& k : json_keys) out.push_back(output_prefix + "_" + k);
  return out;
}

bool is_jsonl_input(const std::string& path) {
  const std::string ext = fs::path(without_compression_extension(path)).extension().string();
  return ext == ".json" || ext == ".jsonl";
}

std::vector<PreprocessInput> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<PreprocessInput> files;
  for (const std::string& pat : patterns) {
    std::vector<std::string> paths;
    if (has_glob_chars(pat)) {
      glob_t g{};
      const int rc = glob(pat.c_str(), 0, nullptr, &g);  // sorted
      if (rc == 0) {
        for (std::size_t k = 0; k < g.gl_pathc; ++k) paths.emplace_back(g.gl_pathv[k]);
      }
      globfree(&g);
      TRIDENT_REQUIRE(!paths.empty(), "preprocess_data: --input pattern '" << pat << "' matches no file");
    } else {
      paths.push_back(pat);
    }
    for (const std::string& p : paths) {
      std::error_code ec;
      TRIDENT_REQUIRE(fs::exists(p, ec), "preprocess_data: input file '" << p << "' does not exist");
      TRIDENT_REQUIRE(fs::is_regular_file(p, ec), "preprocess_data: input '" << p << "' is not a regular file");
      std::ifstream probe(p, std::ios::binary);
      TRIDENT_REQUIRE(probe.good(), "preprocess_data: cannot open input file '" << p << "'");
      PreprocessInput f;
      f.path = p;
      f.stored = static_cast<std::int64_t>(fs::file_size(p, ec));
      f.size = f.compressed() ? -1 : f.stored;  // measured by the ranks (measure_compressed)
      f.jsonl = is_jsonl_input(p);
      files.push_back(f);
    }
  }
  return files;
}

std::int64_t line_number_at(const std::string& path, std::int64_t offset) {
  DecodedReader in(path);  // decoded offsets for compressed files
  std::vector<char> buf(1 << 20);
  std::int64_t line = 1, pos = 0;
  while (pos < offset) {
    const auto got = static_cast<std::int64_t>(
        in.read(buf.data(), static_cast<std::size_t>(std::min<std::int64_t>(buf.size(), offset - pos))));
    if (got <= 0) break;
    line += std::count(buf.data(), buf.data() + got, '\n');
    pos += got;
  }
  return line;
}

ShardSink::ShardSink(const PreprocessOptions& o, const Tokenizer& tok, int rank, std::string prefix)
    : o_(o), tok_(tok), rank_(rank), prefix_(std::move(prefix)) {}

void ShardSink::add(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& sentence_ends) {
  if (!writer_) {
    parts_.push_back(part_name(prefix_, rank_, static_cast<int>(parts_.size())));
    writer_ = std::make_unique<TokenShardWriter>(parts_.back(), o_.tokenizer_type, tok_.vocab_size(), tok_.eod_id(),
                                                 o_.split_sentences);
    writer_->set_special_tokens(tok_.specials());
    writer_->set_tokenizer_digest(tok_.digest());
  }
  writer_->add_document(tokens, sentence_ends);
  if (o_.shard_tokens > 0 && writer_->num_tokens() >= o_.shard_tokens) finish_shard();
}

void ShardSink::finish_shard() {
  if (!writer_) return;
  writer_->close();
  writer_.reset();
}

void ShardSink::discard() {
  writer_.reset();
  for (const std::string& p : parts_) {
    std::error_code ec;
    fs::remove(p, ec);
  }
  parts_.clear();
}

std::string ShardSink::part_name(const std::string& prefix, int rank, int k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, ".part-r%05d-%05d.h5", rank, k);
  return prefix + buf;
}

PreprocessWorker::PreprocessWorker(const PreprocessOptions& o, const Tokenizer& tok, int rank, int nranks,
                                   std::int64_t my_bytes)
    : o_(o), tok_(tok), rank_(rank), nranks_(nranks), my_bytes_(my_bytes) {
  for (const std::string& p : o.prefixes()) sinks_.push_back(std::make_unique<ShardSink>(o, tok, rank, p));
  t0_ = Clock::now();
}

void PreprocessWorker::document(std::string_view text, std::size_t k) {
  tokens_.clear();
  ends_.clear();
  if (o_.split_sentences) {
    std::size_t begin = 0;
    for (std::size_t end : split_sentences(text)) {
      tok_.encode_append(text.substr(begin, end - begin), tokens_);
      ends_.push_back(static_cast<std::int64_t>(tokens_.size()));
      begin = end;
    }
  } else {
    tok_.encode_append(text, tokens_);
  }
  if (tokens_.empty()) {
    ++stats_.skipped;
    return;
  }
  if (o_.append_eod) {
    tokens_.push_back(tok_.eod_id());
    if (!ends_.empty()) ends_.back() = static_cast<std::int64_t>(tokens_.size());
  }
  sinks_[k]->add(tokens_, ends_);
  ++stats_.documents;
  stats_.tokens += static_cast<std::int64_t>(tokens_.size());
  stats_.sentences += static_cast<std::int64_t>(ends_.size());
  if (rank_ == 0 && o_.log_interval > 0 && stats_.documents % o_.log_interval == 0) progress();
}

void PreprocessWorker::progress() const {
  const double dt = std::max(seconds_since(t0_), 1e-9);
  std::printf("[rank 0 of %d] %lld documents, %lld tokens, %.0f tokens/s, %.2f MB/s, %.0f%% of its input\n", nranks_,
              static_cast<long long>(stats_.documents), static_cast<long long>(stats_.tokens), stats_.tokens / dt,
              stats_.bytes / dt / 1e6, my_bytes_ > 0 ? 100.0 * stats_.bytes / my_bytes_ : 100.0);
  std::fflush(stdout);
}

void PreprocessWorker::jsonl_range(const PreprocessInput& f, std::int64_t begin, std::int64_t end) {
  for_each_line_in_range(f.path, begin, end, [&](std::string_view line, std::int64_t start, std::int64_t bytes) {
    add_bytes(bytes);
    bool has_text = false;
    try {
      has_text = jsonl_texts(line, o_.json_keys, texts_);
    } catch (const Error& e) {
      throw Error::one("preprocess_data: " + f.path + ":" + std::to_string(line_number_at(f.path, start)) + ": " +
                       e.what());
    }
    if (has_text)
      for (std::size_t k = 0; k < texts_.size(); ++k) document(texts_[k], k);
  });
}

void PreprocessWorker::plain_file(const PreprocessInput& f) {
  DecodedReader in(f.path);
  std::string text(static_cast<std::size_t>(f.size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const std::size_t n = in.read(text.data() + got, text.size() - got);
    if (n == 0) break;
    got += n;
  }
  TRIDENT_REQUIRE(got == text.size(), "preprocess_data: cannot read input file '" << f.path << "' (" << got << " of "
                                                                                  << f.size << " bytes; it changed?)");
  add_bytes(f.size);
  document(text);
}

std::string shard_final_name(const std::string& prefix, std::int64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%05lld.h5", static_cast<long long>(index));
  return prefix + buf;
}

std::vector<std::pair<std::int64_t, std::string>> existing_shards(const std::string& prefix) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  const fs::path p(prefix);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string stem = p.filename().string() + "_";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= stem.size() + 3 || name.compare(0, stem.size(), stem) != 0) continue;
    if (name.compare(name.size() - 3, 3, ".h5") != 0) continue;
    const std::string digits = name.substr(stem.size(), name.size() - stem.size() - 3);
    if (digits.size() < 5 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.emplace_back(std::stoll(digits), (dir / name).string());
  }
  return out;
}

}  // namespace trident
