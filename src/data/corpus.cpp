// Corpus over token shards: parse_shard_spec (files, globs and Megatron's weighted "w path"
// pairs; glob matches sorted, a glob matching nothing is an error), the Corpus that opens every
// shard, checks that they agree on tokenizer, vocabulary and special tokens and lists their
// non-empty documents in order, and split_documents (data.split ratios to document boundaries).
#include "data/corpus.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "common/error.hpp"
#include "data/indexed_dataset.hpp"
#include "data/tokenizer.hpp"

namespace trident {

namespace {
bool is_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end && *end == '\0';
}

std::vector<std::string> expand(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  // a Megatron prefix names no file itself
  if (out.empty() && !indexed_dataset_prefix(pattern).empty()) out.push_back(pattern);
  TRIDENT_REQUIRE(!out.empty(), "data.train_shards: '" << pattern << "' matches no file");
  // P.bin and P.idx are one corpus file, P (a .bin without its .idx stays as it is: an error
  // when opened)
  for (auto& p : out)
    if (const std::string prefix = indexed_dataset_prefix(p); !prefix.empty()) p = prefix;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}
}  // namespace

std::vector<WeightedPaths> parse_shard_spec(const std::string& spec) {
  std::istringstream is(spec);
  std::vector<std::string> words;
  for (std::string w; is >> w;) {
    // allow commas as separators too
    std::stringstream ws(w);
    for (std::string p; std::getline(ws, p, ',');)
      if (!p.empty()) words.push_back(p);
  }
  TRIDENT_REQUIRE(!words.empty(), "data.train_shards is empty");
  std::vector<WeightedPaths> out;
  const bool weighted = is_number(words[0]);
  if (!weighted) {
    WeightedPaths all;
    for (auto& w : words) {
      TRIDENT_REQUIRE(!is_number(w), "data.train_shards: weights must precede every path (Megatron's form) or none");
      for (auto& p : expand(w)) all.paths.push_back(p);
    }
    out.push_back(std::move(all));
    return out;
  }
  TRIDENT_REQUIRE(words.size() % 2 == 0, "data.train_shards: expected 'weight path' pairs, got an odd number of words");
  for (size_t i = 0; i < words.size(); i += 2) {
    TRIDENT_REQUIRE(is_number(words[i]), "data.train_shards: '" << words[i] << "' is not a weight");
    WeightedPaths wp;
    wp.weight = std::strtod(words[i].c_str(), nullptr);
    TRIDENT_REQUIRE(wp.weight > 0, "data.train_shards: weight " << words[i] << " must be > 0");
    wp.paths = expand(words[i + 1]);
    out.push_back(std::move(wp));
  }
  return out;
}

std::optional<TokenShardMeta> indexed_dataset_description(const std::string& type, const std::string& vocab_file,
                                                          const std::string& merges_file, int extra_ids,
                                                          const std::string& model) {
  if (type.empty()) return std::nullopt;
  const auto tok = make_tokenizer(type, vocab_file, merges_file, extra_ids, model);
  TokenShardMeta d;
  d.format = kIndexedFormat;
  d.tokenizer = type;
  d.tokenizer_digest = tok->digest();
  d.vocab_size = tok->vocab_size();
  d.specials = tok->specials();
  d.eod_id = d.specials.eod;
  d.specials.eod = -1;  // as a shard records it: eod in eod_id; unk not recorded
  d.specials.unk = -1;
  return d;
}

Corpus::Corpus(const std::vector<std::string>& paths, const TokenShardMeta* indexed) {
  TRIDENT_REQUIRE(!paths.empty(), "corpus: no shard files");
  for (auto& p : paths) shards_.emplace_back(p, indexed);
  for (size_t s = 0; s < shards_.size(); ++s) {
    const auto& m = shards_[s].meta();
    if (s == 0) {
      vocab_size_ = m.vocab_size;
      eod_id_ = m.eod_id;
      tokenizer_ = m.tokenizer;
    } else {
      const auto& f = shards_[0].meta();
      const SpecialTokens &a = m.specials, &b = f.specials;
      TRIDENT_REQUIRE(a.cls == b.cls && a.sep == b.sep && a.mask == b.mask && a.pad == b.pad && a.bos == b.bos &&
                          a.eos == b.eos && a.sentinel == b.sentinel && a.num_sentinels == b.num_sentinels,
                      "shard '" << m.path << "' records other special-token ids than '" << f.path << "'");
      const std::string& fd = shards_[0].meta().tokenizer_digest;
      TRIDENT_REQUIRE(m.tokenizer_digest.empty() || fd.empty() || m.tokenizer_digest == fd,
                      "shard '" << m.path << "' was tokenized with other tokenizer files than '"
                                << shards_[0].meta().path << "' (tokenizer_digest " << m.tokenizer_digest.substr(0, 16)
                                << "... against " << fd.substr(0, 16) << "...)");
      TRIDENT_REQUIRE(m.vocab_size == vocab_size_ && m.tokenizer == tokenizer_,
                      "shard '" << m.path << "' (tokenizer " << m.tokenizer << ", vocab_size " << m.vocab_size
                                << ") does not match '" << shards_[0].meta().path << "' (tokenizer " << tokenizer_
                                << ", vocab_size " << vocab_size_ << ")");
    }
    has_sentences_ = has_sentences_ && m.has_sentences;
    num_tokens_ += m.num_tokens;
  }
  where_ = "corpus of '" + shards_.front().meta().path + "'";
  // raw document numbering over the shards; the empty documents (no tokens) are skipped
  shard_first_.push_back(0);
  for (const auto& sh : shards_) shard_first_.push_back(shard_first_.back() + sh.meta().num_documents);
  const std::int64_t raw = shard_first_.back();
  std::int64_t empty = 0;
  guarded([&] {
    for (const auto& sh : shards_) {
      const OffsetList& off = sh.document_offsets();
      for (std::int64_t d = 0; d + 1 < off.size(); ++d) empty += off[d + 1] == off[d] ? 1 : 0;
    }
  });
  if (empty > 0) {
    nonempty_.reserve(static_cast<std::size_t>(raw - empty));
    guarded([&] {
      for (std::size_t s = 0; s < shards_.size(); ++s) {
        const OffsetList& off = shards_[s].document_offsets();
        for (std::int64_t d = 0; d + 1 < off.size(); ++d)
          if (off[d + 1] > off[d]) nonempty_.push_back(shard_first_[s] + d);
      }
    });
  }
  num_docs_ = raw - empty;
  TRIDENT_REQUIRE(num_docs_ > 0, "corpus: the shards hold no documents");
}

std::pair<std::size_t, std::int64_t> Corpus::locate(std::int64_t d) const {
  const std::int64_t r = nonempty_.empty() ? d : nonempty_[static_cast<std::size_t>(d)];
  const auto it = std::upper_bound(shard_first_.begin(), shard_first_.end(), r);
  const auto s = static_cast<std::size_t>(it - shard_first_.begin()) - 1;
  return {s, r - shard_first_[s]};
}

std::int64_t Corpus::document_length(std::int64_t d) const {
  const auto [s, k] = locate(d);
  const OffsetList& off = shards_[s].document_offsets();
  return guarded([&] { return off[k + 1] - off[k]; });
}

void Corpus::read(std::int64_t d, std::int64_t offset, std::int64_t count, std::int32_t* out) const {
  const auto [s, k] = locate(d);
  const OffsetList& off = shards_[s].document_offsets();
  const std::int64_t begin = guarded([&] { return off[k]; });
  shards_[s].read(begin + offset, count, out);
}

std::vector<std::int64_t> Corpus::sentence_bounds(std::int64_t d) const {
  std::vector<std::int64_t> out;
  if (!has_sentences_) return out;
  const auto [s, k] = locate(d);
  const OffsetList& doc = shards_[s].document_offsets();
  const OffsetList& so = shards_[s].sentence_offsets();
  std::int64_t begin = 0, end = 0, lo = 0;
  guarded([&] {
    begin = doc[k];
    end = doc[k + 1];
    // first sentence offset >= begin (every document boundary is one)
    std::int64_t hi = so.size();
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (so[mid] < begin)
        lo = mid + 1;
      else
        hi = mid;
    }
  });
  std::int64_t prev = -1;
  for (std::int64_t i = lo; i < so.size(); ++i) {
    const std::int64_t x = guarded([&] { return so[i]; });
    if (x > end) break;
    if (x != prev) out.push_back(x - begin);  // a Megatron pair's empty sequences repeat an offset
    prev = x;
  }
  return out;
}

std::string Corpus::identity() const {
  std::ostringstream os;
  for (const auto& sh : shards_) {
    struct stat st {};
    const std::string given = sh.meta().format == kIndexedFormat ? sh.meta().path + ".bin" : sh.meta().path;
    std::error_code ec;
    const std::string canonical = std::filesystem::weakly_canonical(given, ec).string();
    const std::string& p = ec ? given : canonical;  // one key for every spelling of the path
    ::stat(p.c_str(), &st);
    os << p << ":" << st.st_size << ":" << st.st_mtim.tv_sec << "." << st.st_mtim.tv_nsec << ":"
       << sh.meta().num_documents << ";";
  }
  return os.str();
}

std::string Corpus::changed_message() const {
  std::string out;
  for (const auto& sh : shards_) {
    const std::string c = sh.changed_on_disk();
    if (!c.empty())
      out += (out.empty() ? "" : "; ") + std::string("token shard '") + sh.meta().path +
             "' changed while the job reads it: " + c;
  }
  return out.empty() ? where_ + " changed while the job reads it: a memory-mapped file shrank (SIGBUS)" : out;
}

std::vector<std::int64_t> split_documents(const std::string& ratios, std::int64_t n) {
  std::vector<double> r;
  std::stringstream ss(ratios);
  for (std::string p; std::getline(ss, p, ',');) {
    TRIDENT_REQUIRE(is_number(p) && std::strtod(p.c_str(), nullptr) >= 0,
                    "data.split: '" << ratios << "' is not a list of non-negative numbers");
    r.push_back(std::strtod(p.c_str(), nullptr));
  }
  TRIDENT_REQUIRE(!r.empty() && r.size() <= 3, "data.split: '" << ratios << "' needs 1 to 3 ratios");
  while (r.size() < 3) r.push_back(0.0);
  const double sum = r[0] + r[1] + r[2];
  TRIDENT_REQUIRE(sum > 0, "data.split: ratios sum to zero");
  std::vector<std::int64_t> b = {0};
  double acc = 0;
  for (int i = 0; i < 3; ++i) {
    acc += r[i] / sum;
    b.push_back(static_cast<std::int64_t>(std::llround(acc * static_cast<double>(n))));
  }
  b[3] = n;
  return b;
}

}  // namespace trident
