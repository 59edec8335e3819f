// GPT dataset, blending, and the train/valid construction: GptDataset's per-epoch document
// shuffle and sample order (Fisher-Yates over a counter-based generator, the same on every
// platform) and sample reads that cross document boundaries; BlendedDataset's assignment of each
// sample to the dataset lagging its weight most; GptData, one corpus per weighted group of
// data.train_shards, split into train / valid documents.
#include "data/gpt_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "common/error.hpp"
#include "common/rng.hpp"

namespace trident {

namespace {
// Fisher-Yates with a counter-based generator: identical on every platform and library.
void shuffle_in_place(std::vector<std::int64_t>& v, std::uint64_t key) {
  CounterRng rng(key);
  for (std::int64_t i = static_cast<std::int64_t>(v.size()) - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(
        rng.below_at(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i + 1)));
    std::swap(v[i], v[j]);
  }
}
}  // namespace

GptDataset::GptDataset(const Corpus& corpus, std::int64_t doc_begin, std::int64_t doc_end, std::int64_t seq_length,
                       std::int64_t num_samples, std::uint64_t seed, const std::string& name, bool shuffle,
                       const std::string& cache_dir)
    : corpus_(&corpus), seq_length_(seq_length), doc_begin_(doc_begin), doc_end_(doc_end) {
  TRIDENT_REQUIRE(doc_end > doc_begin, "dataset '" << name << "' has no documents (check data.split)");
  std::ostringstream key;
  key << "trident gpt index 1|" << corpus.identity() << "|documents " << doc_begin << ".." << doc_end << "|seq_length "
      << seq_length << "|samples " << num_samples << "|seed " << seed << "|name " << name << "|shuffle " << shuffle;
  key_ = key.str();
  auto build = [&] {
    std::int64_t epoch_tokens = 0;
    corpus.guarded([&] {
      for (std::int64_t d = doc_begin; d < doc_end; ++d) epoch_tokens += corpus.document_length(d);
    });
    TRIDENT_REQUIRE(epoch_tokens > seq_length, "dataset '" << name << "' has " << epoch_tokens
                                                           << " tokens, fewer than one sequence of " << seq_length + 1);
    // epochs so that (tokens - 1) / seq_length >= num_samples
    std::int64_t epochs = 1;
    while ((epochs * epoch_tokens - 1) / seq_length < std::max<std::int64_t>(num_samples, 1)) ++epochs;
    const std::uint64_t rng_key = splitmix64(seed) ^ hash_string(name);
    std::vector<std::vector<std::int64_t>> a(3);
    std::vector<std::int64_t>&doc_idx = a[0], &doc_start = a[1], &order = a[2];
    doc_idx.reserve(static_cast<std::size_t>(epochs * (doc_end - doc_begin)));
    for (std::int64_t e = 0; e < epochs; ++e) {
      std::vector<std::int64_t> perm;
      perm.reserve(static_cast<std::size_t>(doc_end - doc_begin));
      for (std::int64_t d = doc_begin; d < doc_end; ++d) perm.push_back(d);
      if (shuffle) shuffle_in_place(perm, rng_key + static_cast<std::uint64_t>(e) * 0x9E37ull);
      doc_idx.insert(doc_idx.end(), perm.begin(), perm.end());
    }
    doc_start.resize(doc_idx.size() + 1);
    doc_start[0] = 0;
    for (std::size_t k = 0; k < doc_idx.size(); ++k)
      doc_start[k + 1] = doc_start[k] + corpus.document_length(doc_idx[k]);
    const std::int64_t n = (doc_start.back() - 1) / seq_length;
    order.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
    if (shuffle) shuffle_in_place(order, rng_key ^ 0xABCDEF12345ull);
    return a;
  };
  index_ = cached_index(cache_dir, "gpt", key_, build);
  where_ = index_.file().empty() ? "dataset '" + name + "'" : "dataset index cache '" + index_.file() + "'";
  const std::int64_t docs = doc_end - doc_begin;
  TRIDENT_REQUIRE(index_.count() == 3 && index_.size(0) % docs == 0 && index_.size(0) > 0 &&
                      index_.size(1) == index_.size(0) + 1 && index_.size(2) > 0,
                  where_ << ": the index does not fit its documents (delete the cache file)");
  epochs_ = index_.size(0) / docs;
  num_samples_ = index_.size(2);
}

void GptDataset::get(std::int64_t i, std::int32_t* out) const {
  const std::int64_t* doc_idx = index_.data(0);
  const std::int64_t* doc_start = index_.data(1);
  const std::int64_t n_pos = index_.size(0);
  std::int64_t s = 0, k = 0;
  guarded_map_read(where_, [&] {
    s = index_.data(2)[i % num_samples_];
    // k: last document starting at or before pos
    const std::int64_t* it = std::upper_bound(doc_start, doc_start + n_pos + 1, s * seq_length_);
    k = static_cast<std::int64_t>(it - doc_start) - 1;
  });
  TRIDENT_REQUIRE(s >= 0 && s < num_samples_ && k >= 0,
                  where_ << ": sample " << i << " maps to " << s << ", outside the dataset (a corrupt index cache?)");
  std::int64_t pos = s * seq_length_;
  std::int64_t need = seq_length_ + 1;
  while (need > 0) {
    TRIDENT_REQUIRE(k < n_pos, where_ << ": sample " << s << " runs past the end of its index (a corrupt cache?)");
    std::int64_t doc = 0, start = 0, next = 0;
    guarded_map_read(where_, [&] {
      doc = doc_idx[k];
      start = doc_start[k];
      next = doc_start[k + 1];
    });
    TRIDENT_REQUIRE(doc >= doc_begin_ && doc < doc_end_ && start <= pos && next >= pos,
                    where_ << ": entry " << k << " of the index is inconsistent (a corrupt index cache?)");
    const std::int64_t take = std::min(need, next - pos);
    corpus_->read(doc, pos - start, take, out);
    out += take;
    pos += take;
    need -= take;
    ++k;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
                               std::int64_t num_samples, const std::string& cache_dir)
    : datasets_(std::move(datasets)) {
  std::ostringstream key;
  key << std::setprecision(17) << "trident blend 1|samples " << num_samples;
  for (std::size_t d = 0; d < datasets_.size(); ++d) key << "|weight " << weights[d] << " " << datasets_[d]->key();
  auto build = [&] {
    double total = 0;
    for (double w : weights) total += w;
    std::vector<std::int64_t> count(datasets_.size(), 0);
    std::vector<std::vector<std::int64_t>> a(2);
    std::vector<std::int64_t>&which = a[0], &index = a[1];
    which.resize(static_cast<size_t>(num_samples));
    index.resize(static_cast<size_t>(num_samples));
    for (std::int64_t i = 0; i < num_samples; ++i) {
      size_t best = 0;
      double best_err = -1e300;
      for (size_t d = 0; d < datasets_.size(); ++d) {
        const double err = weights[d] / total * static_cast<double>(i + 1) - static_cast<double>(count[d]);
        if (err > best_err) {
          best_err = err;
          best = d;
        }
      }
      which[i] = static_cast<std::int64_t>(best);
      index[i] = count[best]++;
    }
    return a;
  };
  // one dataset: nothing to cache (the identity assignment costs no more than its build)
  index_ = cached_index(datasets_.size() > 1 ? cache_dir : std::string(), "blend", key.str(), build);
  where_ = index_.file().empty() ? std::string("blended dataset") : "dataset index cache '" + index_.file() + "'";
  TRIDENT_REQUIRE(index_.count() == 2 && index_.size(0) == num_samples && index_.size(1) == num_samples,
                  where_ << ": the blending index does not fit (delete the cache file)");
}

void BlendedDataset::get(std::int64_t i, std::int32_t* out) const {
  const std::int64_t k = i % size();
  std::int64_t which = 0, index = 0;
  guarded_map_read(where_, [&] {
    which = index_.data(0)[k];
    index = index_.data(1)[k];
  });
  TRIDENT_REQUIRE(which >= 0 && which < static_cast<std::int64_t>(datasets_.size()) && index >= 0,
                  where_ << ": blended sample " << k << " is inconsistent (a corrupt index cache?)");
  datasets_[static_cast<std::size_t>(which)]->get(index, out);
}

GptData::GptData(const std::string& shard_spec, const std::string& split, std::int64_t seq_length,
                 std::int64_t train_samples, std::int64_t valid_samples, std::uint64_t seed,
                 const TokenShardMeta* indexed, const std::string& index_cache) {
  auto groups = parse_shard_spec(shard_spec);
  std::vector<std::unique_ptr<GptDataset>> train_sets, valid_sets;
  std::vector<double> weights;
  std::ostringstream desc;
  std::string cache_dir;  // the first corpus's: also holds the blending indices
  double wsum = 0;
  for (auto& g : groups) wsum += g.weight;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    auto& g = groups[gi];
    corpora_.push_back(std::make_unique<Corpus>(g.paths, indexed));
    const Corpus& c = *corpora_.back();
    if (gi == 0) {
      vocab_size_ = c.vocab_size();
      eod_id_ = c.eod_id();
    }
    if (c.eod_id() != eod_id_) eod_id_ = -1;  // (one tokenizer per run makes them equal)
    TRIDENT_REQUIRE(c.vocab_size() == vocab_size_, "data.train_shards: '" << g.paths[0] << "' has vocab_size "
                                                                          << c.vocab_size() << ", others "
                                                                          << vocab_size_);
    const auto b = split_documents(split, c.num_documents());
    const double share = g.weight / wsum;
    // a little slack as Megatron does, so blending never runs a dataset dry
    const auto want = [&](std::int64_t n) { return static_cast<std::int64_t>(std::ceil(n * share * 1.005)) + 1; };
    const std::string tag = "corpus" + std::to_string(gi);
    const std::string dir = index_cache_dir(index_cache, g.paths.front());
    if (gi == 0) cache_dir = dir;
    train_sets.push_back(
        std::make_unique<GptDataset>(c, b[0], b[1], seq_length, want(train_samples), seed, tag + "/train", true, dir));
    if (valid_samples > 0 && b[2] > b[1])
      valid_sets.push_back(std::make_unique<GptDataset>(c, b[1], b[2], seq_length, want(valid_samples), seed,
                                                        tag + "/valid", true, dir));
    weights.push_back(g.weight);
    desc << "  corpus " << gi << ": weight " << share << ", " << g.paths.size() << " shard(s), " << c.num_documents()
         << " documents, " << c.num_tokens() << " tokens, tokenizer " << c.tokenizer() << ", vocab " << c.vocab_size()
         << "; documents train/valid/test = " << b[1] - b[0] << "/" << b[2] - b[1] << "/" << b[3] - b[2]
         << "; train epochs " << train_sets.back()->epochs() << "\n";
    desc << "    index: train " << train_sets.back()->index_origin();
    if (valid_samples > 0 && b[2] > b[1]) desc << "; valid " << valid_sets.back()->index_origin();
    desc << "\n";
  }
  train_ = std::make_unique<BlendedDataset>(std::move(train_sets), weights, std::max<std::int64_t>(train_samples, 1),
                                            cache_dir);
  if (valid_samples > 0) {
    TRIDENT_REQUIRE(valid_sets.size() == groups.size(),
                    "data.split gives the validation split no documents, but eval.interval > 0 needs one");
    valid_ = std::make_unique<BlendedDataset>(std::move(valid_sets), weights, valid_samples, cache_dir);
  }
  if (groups.size() > 1) desc << "  blending index: train " << train_->index_origin() << "\n";
  description_ = desc.str();
}

}  // namespace trident
