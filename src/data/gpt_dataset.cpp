// GPT dataset, blending, and the train/valid construction: GptDataset's per-epoch document
// shuffle and sample order (Fisher-Yates over a counter-based generator, the same on every
// platform) and sample reads that cross document boundaries; BlendedDataset's assignment of each
// sample to the dataset lagging its weight most; GptData, one corpus per weighted group of
// data.train_shards, split into train / valid documents.
#include "data/gpt_dataset.hpp"

#include <algorithm>
#include <cmath>
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
                       std::int64_t num_samples, std::uint64_t seed, const std::string& name, bool shuffle)
    : corpus_(&corpus), seq_length_(seq_length) {
  TRIDENT_REQUIRE(doc_end > doc_begin, "dataset '" << name << "' has no documents (check data.split)");
  std::int64_t epoch_tokens = 0;
  for (std::int64_t d = doc_begin; d < doc_end; ++d) epoch_tokens += corpus.document_length(d);
  TRIDENT_REQUIRE(epoch_tokens > seq_length, "dataset '" << name << "' has " << epoch_tokens
                                                         << " tokens, fewer than one sequence of " << seq_length + 1);
  // epochs so that (tokens - 1) / seq_length >= num_samples
  epochs_ = 1;
  while ((epochs_ * epoch_tokens - 1) / seq_length < std::max<std::int64_t>(num_samples, 1)) ++epochs_;
  const std::uint64_t key = splitmix64(seed) ^ hash_string(name);
  for (std::int64_t e = 0; e < epochs_; ++e) {
    std::vector<std::int64_t> order;
    for (std::int64_t d = doc_begin; d < doc_end; ++d) order.push_back(d);
    if (shuffle) shuffle_in_place(order, key + static_cast<std::uint64_t>(e) * 0x9E37ull);
    doc_idx_.insert(doc_idx_.end(), order.begin(), order.end());
  }
  doc_start_.resize(doc_idx_.size() + 1);
  doc_start_[0] = 0;
  for (size_t k = 0; k < doc_idx_.size(); ++k) doc_start_[k + 1] = doc_start_[k] + corpus.document_length(doc_idx_[k]);
  num_samples_ = (doc_start_.back() - 1) / seq_length;
  shuffle_.resize(static_cast<size_t>(num_samples_));
  for (std::int64_t i = 0; i < num_samples_; ++i) shuffle_[i] = i;
  if (shuffle) shuffle_in_place(shuffle_, key ^ 0xABCDEF12345ull);
}

void GptDataset::get(std::int64_t i, std::int32_t* out) const {
  const std::int64_t s = shuffle_[static_cast<size_t>(i % num_samples_)];
  std::int64_t pos = s * seq_length_;
  std::int64_t need = seq_length_ + 1;
  // k: last document starting at or before pos
  auto it = std::upper_bound(doc_start_.begin(), doc_start_.end(), pos);
  std::int64_t k = static_cast<std::int64_t>(it - doc_start_.begin()) - 1;
  while (need > 0) {
    const std::int64_t off = pos - doc_start_[k];
    const std::int64_t take = std::min(need, doc_start_[k + 1] - pos);
    corpus_->read(doc_idx_[k], off, take, out);
    out += take;
    pos += take;
    need -= take;
    ++k;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
                               std::int64_t num_samples)
    : datasets_(std::move(datasets)) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<std::int64_t> count(datasets_.size(), 0);
  which_.resize(static_cast<size_t>(num_samples));
  index_.resize(static_cast<size_t>(num_samples));
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
    which_[i] = static_cast<std::int32_t>(best);
    index_[i] = count[best]++;
  }
}

void BlendedDataset::get(std::int64_t i, std::int32_t* out) const {
  const size_t k = static_cast<size_t>(i % size());
  datasets_[which_[k]]->get(index_[k], out);
}

GptData::GptData(const std::string& shard_spec, const std::string& split, std::int64_t seq_length,
                 std::int64_t train_samples, std::int64_t valid_samples, std::uint64_t seed,
                 const TokenShardMeta* indexed) {
  auto groups = parse_shard_spec(shard_spec);
  std::vector<std::unique_ptr<GptDataset>> train_sets, valid_sets;
  std::vector<double> weights;
  std::ostringstream desc;
  double wsum = 0;
  for (auto& g : groups) wsum += g.weight;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    auto& g = groups[gi];
    corpora_.push_back(std::make_unique<Corpus>(g.paths, indexed));
    const Corpus& c = *corpora_.back();
    if (gi == 0) vocab_size_ = c.vocab_size();
    TRIDENT_REQUIRE(c.vocab_size() == vocab_size_, "data.train_shards: '" << g.paths[0] << "' has vocab_size "
                                                                          << c.vocab_size() << ", others "
                                                                          << vocab_size_);
    const auto b = split_documents(split, c.num_documents());
    const double share = g.weight / wsum;
    // a little slack as Megatron does, so blending never runs a dataset dry
    const auto want = [&](std::int64_t n) { return static_cast<std::int64_t>(std::ceil(n * share * 1.005)) + 1; };
    const std::string tag = "corpus" + std::to_string(gi);
    train_sets.push_back(
        std::make_unique<GptDataset>(c, b[0], b[1], seq_length, want(train_samples), seed, tag + "/train"));
    if (valid_samples > 0 && b[2] > b[1])
      valid_sets.push_back(
          std::make_unique<GptDataset>(c, b[1], b[2], seq_length, want(valid_samples), seed, tag + "/valid"));
    weights.push_back(g.weight);
    desc << "  corpus " << gi << ": weight " << share << ", " << g.paths.size() << " shard(s), " << c.num_documents()
         << " documents, " << c.num_tokens() << " tokens, tokenizer " << c.tokenizer() << ", vocab " << c.vocab_size()
         << "; documents train/valid/test = " << b[1] - b[0] << "/" << b[2] - b[1] << "/" << b[3] - b[2]
         << "; train epochs " << train_sets.back()->epochs() << "\n";
  }
  train_ = std::make_unique<BlendedDataset>(std::move(train_sets), weights, std::max<std::int64_t>(train_samples, 1));
  if (valid_samples > 0) {
    TRIDENT_REQUIRE(valid_sets.size() == groups.size(),
                    "data.split gives the validation split no documents, but eval.interval > 0 needs one");
    valid_ = std::make_unique<BlendedDataset>(std::move(valid_sets), weights, valid_samples);
  }
  description_ = desc.str();
}

}  // namespace trident
