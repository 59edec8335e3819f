// bench_loader: the GPT data path alone, without a model (perf/bench_data_scale.py runs it).
// Builds the datasets of a shard spec as pretrain_gpt does (GptData: corpora, split, GPT
// indices, blending; data.index_cache), then reads --read consecutive training samples as the
// trainer would, and prints one line of key=value figures:
//   build_s      seconds to open the corpora and build or load the indices
//   samples_per_s, tokens_per_s   the read rate of samples (seq_length + 1 tokens each)
//   rss_anon_mb, rss_file_mb      this process's resident memory: private (heap) and file-backed
//                                 (mapped shards' offsets and index caches, shared between ranks)
// then the datasets' description (where each index came from: built in memory / built,
// cached / loaded).
//
//   bench_loader --shards 'corpus/*.h5' --seq-length 1024 --train-samples 1000000 --read 20000
//                [--index-cache auto|none|DIR] [--split 969,30,1] [--seed 1234]
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "data/gpt_dataset.hpp"

namespace po = boost::program_options;

namespace {
double status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string want = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(want, 0) == 0) return std::stod(line.substr(want.size())) / 1024.0;  // kB
  return -1;
}
}  // namespace

int main(int argc, char** argv) {
  std::string shards, split = "969,30,1", cache = "auto", tok_type, vocab, merges;
  std::int64_t seq = 1024, train_samples = 1000, read = 1000;
  std::uint64_t seed = 1234;
  po::options_description desc("bench_loader: the GPT data path alone");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help")
    ("shards", po::value<std::string>(&shards)->required(), "data.train_shards")
    ("split", po::value<std::string>(&split), "data.split")
    ("seq-length", po::value<std::int64_t>(&seq), "model.seq_length")
    ("train-samples", po::value<std::int64_t>(&train_samples), "samples the training run would consume")
    ("read", po::value<std::int64_t>(&read), "samples to read")
    ("seed", po::value<std::uint64_t>(&seed), "train.seed")
    ("index-cache", po::value<std::string>(&cache), "data.index_cache")
    ("tokenizer-type", po::value<std::string>(&tok_type), "data.tokenizer_type (Megatron pairs)")
    ("vocab-file", po::value<std::string>(&vocab), "data.vocab_file")
    ("merge-file", po::value<std::string>(&merges), "data.merges_file");
  // clang-format on
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const auto indexed = trident::indexed_dataset_description(tok_type, vocab, merges, 0);
    trident::GptData data(shards, split, seq, train_samples, 0, seed, indexed ? &*indexed : nullptr, cache);
    const double build_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<std::int32_t> sample(static_cast<std::size_t>(seq + 1));
    std::uint64_t sum = 0;
    const auto t1 = Clock::now();
    for (std::int64_t i = 0; i < read; ++i) {
      data.train().get(i, sample.data());
      sum += static_cast<std::uint32_t>(sample[static_cast<std::size_t>(i % (seq + 1))]);
    }
    const double read_s = std::max(std::chrono::duration<double>(Clock::now() - t1).count(), 1e-9);
    std::printf(
        "build_s=%.3f samples_per_s=%.1f tokens_per_s=%.0f rss_anon_mb=%.1f rss_file_mb=%.1f hwm_mb=%.1f checksum=%llu\n",
        build_s, read / read_s, read * static_cast<double>(seq) / read_s, status_mb("RssAnon"), status_mb("RssFile"),
        status_mb("VmHWM"), static_cast<unsigned long long>(sum));
    std::printf("%s", data.describe().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
