// preprocess_data: tokenizes a corpus into Trident token shards (docs/DESIGN.md, "Preprocessing
// command line" and "Token shards"), with Megatron-LM's flags so that users' scripts carry over.
//
//   mpiexec -n 4 preprocess_data --input 'corpus/*.jsonl' --output-prefix out/pile_gpt2 \
//       --tokenizer-type GPT2BPETokenizer --vocab-file gpt2/encoder.json --merge-file gpt2/vocab.bpe \
//       --append-eod --shard-tokens 100000000
//
// Inputs: .json / .jsonl files are JSON lines (one object per line, the text under --json-keys;
// several keys give one shard set per key); any other file is plain text, one document per
// file. A further .zst, .gz or .xz is decoded as a stream (data/compressed_input.hpp); byte
// offsets below are decoded offsets, the decoded sizes measured once at the start. The inputs, concatenated in the
// given order (globs sorted), are cut into one contiguous byte range per rank; a line belongs to the rank holding its
// first byte and a plain-text file to the rank holding its first byte, so each rank tokenizes a contiguous run of
// documents. Each rank writes its shards under temporary names; at the end the shard counts are prefix-summed and the
// files renamed <output-prefix>_NNNNN.h5, so that sorting the names gives the input order of the documents. Documents
// with no text (no tokens before the EOD) are skipped and counted.
//
// Errors every rank can see (bad flags, missing inputs, unreadable vocabulary) and errors of
// one rank (a bad JSON line) are agreed collectively: one message, exit code 1, no hang.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "comm/agreement.hpp"
#include "comm/communicator.hpp"
#include "common/error.hpp"
#include "data/compressed_input.hpp"
#include "data/preprocess.hpp"
#include "data/tokenizer.hpp"
#include "runtime/app_driver.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using trident::Error;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- command line ------------------------------------------------------------------------------

// Parses the flags; returns nullopt after printing --help. Throws Error::all on bad flags (every
// rank parses the same argv, so every rank throws the same error).
std::optional<trident::PreprocessOptions> parse_options(int argc, char** argv, int rank) {
  trident::PreprocessOptions o;
  std::vector<std::string> json_keys;
  po::options_description desc(
      "preprocess_data: tokenize JSON-lines / plain-text corpora into Trident token shards\n"
      "usage: mpiexec -n N preprocess_data --input FILES... --output-prefix PREFIX --tokenizer-type "
      "GPT2BPETokenizer --vocab-file encoder.json --merge-file vocab.bpe [--append-eod] ...\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help")
    ("input", po::value<std::vector<std::string>>(&o.inputs)->multitoken(),
     "input files or globs (quote them); .json/.jsonl = JSON lines, anything else = plain text, one document per file")
    ("output-prefix", po::value<std::string>(&o.output_prefix), "shards are written as <prefix>_NNNNN.h5")
    ("tokenizer-type", po::value<std::string>(&o.tokenizer_type),
     "GPT2BPETokenizer, GPT2BPEWithBertSpecials (GPT-2's BPE plus [CLS] [SEP] [MASK] [PAD]), "
     "BertWordPieceLowerCase, BertWordPieceCase, HuggingFaceTokenizer (a tokenizer.json: Llama, Mistral, Qwen, ...), "
     "SentencePieceTokenizer (a .model)")
    ("tokenizer-model", po::value<std::string>(&o.tokenizer_model),
     "HuggingFaceTokenizer: its tokenizer.json (or the directory holding it and tokenizer_config.json); "
     "SentencePieceTokenizer: its .model file")
    ("vocab-file", po::value<std::string>(&o.vocab_file), "GPT-2 encoder.json / vocab.json, or BERT's vocab.txt")
    ("merge-file", po::value<std::string>(&o.merge_file), "GPT-2 vocab.bpe / merges.txt (BPE only)")
    ("json-keys", po::value<std::vector<std::string>>(&json_keys)->multitoken(),
     "keys of the texts in each JSON line (default: text); several keys give one set of shards each, "
     "<prefix>_<key>_NNNNN.h5 (Megatron's behaviour)")
    ("append-eod", po::bool_switch(&o.append_eod), "append the end-of-document token to every document")
    ("overwrite", po::bool_switch(&o.overwrite),
     "replace the shards an earlier run wrote with this prefix (without it, existing shards are an error)")
    ("vocab-extra-ids", po::value<int>(&o.vocab_extra_ids)->default_value(0),
     "append [BOS], [EOS] and N sentinels <extra_id_0>.. to the vocabulary (T5: 100)")
    ("split-sentences", po::bool_switch(&o.split_sentences),
     "split documents into sentences (rule-based) and store /sentence_offsets")
    ("shard-tokens", po::value<std::int64_t>(&o.shard_tokens)->default_value(0),
     "start a new shard after at least N tokens, at a document boundary (0: one shard per rank)")
    ("log-interval", po::value<std::int64_t>(&o.log_interval)->default_value(100),
     "progress line every N documents of rank 0 (0: none)")
    // Megatron flags accepted for compatibility; MPI ranks replace workers.
    ("workers", po::value<int>(), "ignored (use MPI ranks)")
    ("partitions", po::value<int>(), "ignored")
    ("chunk-size", po::value<int>(), "ignored")
    ("dataset-impl", po::value<std::string>(), "ignored (shards are HDF5)")
    ("keep-newlines", po::bool_switch(), "ignored (sentences always keep their white space)")
    ("lang", po::value<std::string>(), "ignored (the sentence splitter is rule-based)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error::all(std::string("preprocess_data: ") + e.what() + " (see --help)");
  }
  if (vm.count("help")) {
    if (rank == 0) std::cout << desc << std::endl;
    return std::nullopt;
  }
  TRIDENT_REQUIRE(!o.inputs.empty(), "preprocess_data: --input is required");
  TRIDENT_REQUIRE(!o.output_prefix.empty(), "preprocess_data: --output-prefix is required");
  TRIDENT_REQUIRE(!o.tokenizer_type.empty(),
                  "preprocess_data: --tokenizer-type is required (" << trident::tokenizer_types() << ")");
  const std::string& t = o.tokenizer_type;
  const bool bpe = t == "GPT2BPETokenizer" || t == "GPT2BPEWithBertSpecials";
  const bool model = t == "HuggingFaceTokenizer" || t == "SentencePieceTokenizer";
  TRIDENT_REQUIRE(bpe || model || t == "BertWordPieceLowerCase" || t == "BertWordPieceCase",
                  "preprocess_data: unknown --tokenizer-type '" << o.tokenizer_type << "' ("
                                                                << trident::tokenizer_types() << ")");
  if (model) {
    TRIDENT_REQUIRE(!o.tokenizer_model.empty(), "preprocess_data: " << t << " needs --tokenizer-model");
  } else {
    TRIDENT_REQUIRE(!o.vocab_file.empty(), "preprocess_data: " << o.tokenizer_type << " needs --vocab-file");
    TRIDENT_REQUIRE(!bpe || !o.merge_file.empty(), "preprocess_data: " << t << " needs --merge-file");
  }
  if (!json_keys.empty()) {
    for (std::size_t k = 0; k < json_keys.size(); ++k) {
      TRIDENT_REQUIRE(!json_keys[k].empty() && json_keys[k].find('/') == std::string::npos,
                      "preprocess_data: --json-keys '" << json_keys[k] << "' cannot name output files");
      for (std::size_t j = 0; j < k; ++j)
        TRIDENT_REQUIRE(json_keys[j] != json_keys[k],
                        "preprocess_data: --json-keys lists '" << json_keys[k] << "' twice");
    }
    o.json_keys = json_keys;
  }
  TRIDENT_REQUIRE(o.shard_tokens >= 0, "preprocess_data: --shard-tokens must be >= 0");
  TRIDENT_REQUIRE(o.vocab_extra_ids >= 0, "preprocess_data: --vocab-extra-ids must be >= 0");
  TRIDENT_REQUIRE(o.log_interval >= 0, "preprocess_data: --log-interval must be >= 0");
  return o;
}

// ---- inputs --------------------------------------------------------------------------------------

void broadcast_inputs(std::vector<trident::PreprocessInput>& files, const trident::Communicator& world) {
  std::string blob;
  if (world.rank() == 0) {
    for (const trident::PreprocessInput& f : files)
      blob += f.path + '\0' + std::to_string(f.size) + '\0' + (f.jsonl ? "1" : "0") + '\0' + std::to_string(f.stored) +
              '\0';
  }
  blob = world.broadcast_text(blob);
  if (world.rank() == 0) return;
  files.clear();
  std::vector<std::string> fields;
  std::size_t pos = 0;
  while (pos < blob.size()) {
    const std::size_t end = blob.find('\0', pos);
    fields.push_back(blob.substr(pos, end - pos));
    pos = end + 1;
  }
  for (std::size_t k = 0; k + 3 < fields.size(); k += 4) {
    files.push_back(trident::PreprocessInput{fields[k], std::stoll(fields[k + 1]), fields[k + 2] == "1",
                                             std::stoll(fields[k + 3])});
  }
}

// The decoded sizes of the compressed inputs: rank r decodes compressed files r, r + n, ... once
// (the byte ranges of the ranks are cut over decoded bytes, so that compressed and uncompressed
// inputs give the same shards). Returns the seconds it took.
double measure_compressed(std::vector<trident::PreprocessInput>& files, const trident::Communicator& world) {
  const auto t0 = Clock::now();
  std::vector<std::int64_t> sizes(files.size(), 0);
  std::size_t k = 0;
  std::string err;  // a corrupt file is met by the one rank that decodes it: agreed before the sum
  try {
    for (std::size_t i = 0; i < files.size(); ++i) {
      if (!files[i].compressed()) continue;
      if (static_cast<int>(k++ % static_cast<std::size_t>(world.size())) == world.rank())
        sizes[i] = trident::decoded_size(files[i].path);
    }
  } catch (const std::exception& e) {
    err = std::string("preprocess_data: ") + e.what();
  }
  trident::agree_or_throw(world.get(), err);
  world.allreduce_sum(sizes.data(), static_cast<std::int64_t>(sizes.size()));
  for (std::size_t i = 0; i < files.size(); ++i)
    if (files[i].compressed()) files[i].size = sizes[i];
  return seconds_since(t0);
}

// ---- the per-rank work ---------------------------------------------------------------------------

int run(int argc, char** argv) {
  const trident::Communicator world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.get();
  const int rank = world.rank(), nranks = world.size();
  const auto t0 = Clock::now();

  std::optional<trident::PreprocessOptions> parsed = parse_options(argc, argv, rank);
  if (!parsed) return 0;
  const trident::PreprocessOptions& o = *parsed;

  // Inputs: rank 0 expands the globs and checks the files; everyone gets the list.
  std::vector<trident::PreprocessInput> files;
  {
    std::string err;
    if (rank == 0) {
      try {
        files = trident::expand_inputs(o.inputs);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    trident::agree_or_throw(comm, err);
    broadcast_inputs(files, world);
  }
  double measure_s = 0;
  std::size_t n_compressed = 0;
  for (const trident::PreprocessInput& f : files) n_compressed += f.compressed() ? 1 : 0;
  if (n_compressed > 0) measure_s = measure_compressed(files, world);

  // The tokenizer (every rank loads it; a bad file fails on all of them alike).
  std::unique_ptr<trident::Tokenizer> tok;
  trident::collectively(comm, [&] {
    tok = trident::make_tokenizer(o.tokenizer_type, o.vocab_file, o.merge_file, o.vocab_extra_ids, o.tokenizer_model);
    TRIDENT_REQUIRE(!o.append_eod || tok->eod_id() >= 0,
                    "preprocess_data: --append-eod but the tokenizer '"
                        << (o.tokenizer_model.empty() ? o.vocab_file : o.tokenizer_model)
                        << "' has no end-of-document token (Hugging Face: its tokenizer_config.json's eos_token)");
  });

  // Output directory; stale temporary parts of an earlier, failed run are removed.
  trident::collectively(comm, [&] {
    if (rank != 0) return;
    const fs::path p(o.output_prefix);
    TRIDENT_REQUIRE(!p.filename().empty(),
                    "preprocess_data: --output-prefix '" << o.output_prefix << "' must name files, not a directory");
    std::error_code ec;
    if (p.has_parent_path()) {
      fs::create_directories(p.parent_path(), ec);
      TRIDENT_REQUIRE(!ec, "preprocess_data: cannot create the output directory '" << p.parent_path().string()
                                                                                   << "': " << ec.message());
    }
    if (o.json_keys.size() > 1)
      for (const trident::PreprocessInput& f : files)
        TRIDENT_REQUIRE(f.jsonl, "preprocess_data: --json-keys names " << o.json_keys.size() << " keys, but '" << f.path
                                                                       << "' is plain text (no keys)");
    for (const std::string& prefix : o.prefixes()) {
      const auto existing = trident::existing_shards(prefix);
      TRIDENT_REQUIRE(existing.empty() || o.overwrite,
                      "preprocess_data: "
                          << existing.size() << " shard(s) with prefix '" << prefix << "' exist already ("
                          << existing.front().second
                          << ", ...): pass --overwrite to replace them, or choose another --output-prefix");
    }
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    for (const std::string& prefix : o.prefixes()) {
      const std::string part_stem = fs::path(prefix).filename().string() + ".part-r";
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().filename().string().rfind(part_stem, 0) == 0) fs::remove(e.path(), ec);
      }
    }
  });
  world.barrier();

  // This rank's byte range of the concatenated inputs.
  std::int64_t total_bytes = 0;
  std::int64_t stored_bytes = 0;
  for (const trident::PreprocessInput& f : files) {
    total_bytes += f.size;
    stored_bytes += f.stored;
  }
  const auto cut = [&](int r) { return static_cast<std::int64_t>((static_cast<__int128>(total_bytes) * r) / nranks); };
  const std::int64_t lo = cut(rank), hi = cut(rank + 1);
  if (rank == 0) {
    std::printf("preprocess_data: %zu input file(s), %.1f MB, %d rank(s), tokenizer %s (vocab %lld, eod %d)%s%s\n",
                files.size(), total_bytes / 1e6, nranks, o.tokenizer_type.c_str(),
                static_cast<long long>(tok->vocab_size()), tok->eod_id(), o.append_eod ? ", append EOD" : "",
                o.split_sentences ? ", split sentences" : "");
    if (n_compressed > 0)
      std::printf(
          "preprocess_data: %zu compressed input(s): %.1f MB on disk, %.1f MB decoded; sizes measured by "
          "decoding once in %.2f s\n",
          n_compressed, stored_bytes / 1e6, total_bytes / 1e6, measure_s);
    std::fflush(stdout);
  }

  trident::PreprocessWorker worker(o, *tok, rank, nranks, hi - lo);
  try {
    trident::collectively(comm, [&] {
      std::int64_t g = 0;  // global offset of the file
      for (const trident::PreprocessInput& f : files) {
        const std::int64_t fb = g, fe = g + f.size;
        g = fe;
        if (f.jsonl) {
          const std::int64_t b = std::max(lo, fb), e = std::min(hi, fe);
          if (b < e) worker.jsonl_range(f, b - fb, e - fb);
        } else {
          // A plain-text file belongs to the rank holding its first byte (an empty file at the
          // very end of the input to the last rank).
          const bool mine = (fb >= lo && fb < hi) || (fb == total_bytes && rank == nranks - 1);
          if (mine) worker.plain_file(f);
        }
      }
      for (auto& sink : worker.sinks()) sink->finish_shard();
    });
  } catch (...) {
    // Some rank failed: every rank drops what it wrote, so no partial output looks complete.
    for (auto& sink : worker.sinks()) sink->discard();
    throw;
  }

  // Global shard numbering, per key: exclusive prefix sum of the shard counts in rank order.
  std::vector<long long> total_shards;
  std::int64_t my_shards = 0;
  for (auto& sink : worker.sinks()) {
    const auto mine = static_cast<std::int64_t>(sink->parts().size());
    my_shards += mine;
    const long long first = world.exscan_sum(mine);
    total_shards.push_back(world.allreduce_sum(mine));
    trident::collectively(comm, [&] {
      for (std::size_t k = 0; k < sink->parts().size(); ++k) {
        const std::string dst = trident::shard_final_name(sink->prefix(), first + static_cast<long long>(k));
        std::error_code ec;
        fs::rename(sink->parts()[k], dst, ec);
        TRIDENT_REQUIRE(!ec, "preprocess_data: cannot rename '" << sink->parts()[k] << "' to '" << dst
                                                                << "': " << ec.message());
      }
    });
  }
  world.barrier();

  // Totals and the summary.
  const trident::PreprocessStats& s = worker.stats();
  std::int64_t totals[6] = {s.documents, s.skipped, s.tokens, s.sentences, s.bytes, my_shards};
  world.allreduce_sum(totals, 6);
  long long sum[6];
  for (int k = 0; k < 6; ++k) sum[k] = static_cast<long long>(totals[k]);
  if (rank == 0) {
    // Shards left over from an earlier run with this prefix would be taken for part of this one.
    // (--overwrite; without it there were none). When this run wrote nothing, the earlier
    // shards stay: they are deleted only when new output replaces them.
    int stale = 0;
    const auto prefixes = o.prefixes();
    for (std::size_t k = 0; k < prefixes.size(); ++k)
      for (const auto& [index, path] : trident::existing_shards(prefixes[k])) {
        if (total_shards[k] > 0 && index >= total_shards[k]) {
          std::error_code ec;
          if (fs::remove(path, ec)) ++stale;
        }
      }
    const double dt = std::max(seconds_since(t0), 1e-9);
    std::printf("preprocess_data: done in %.2f s: %lld documents (%lld empty skipped), %lld tokens", dt, sum[0], sum[1],
                sum[2]);
    if (o.split_sentences) std::printf(", %lld sentences", sum[3]);
    std::printf(", %.1f MB; %.0f tokens/s, %.2f MB/s over %d rank(s)\n", sum[4] / 1e6, sum[2] / dt, sum[4] / dt / 1e6,
                nranks);
    for (std::size_t k = 0; k < prefixes.size(); ++k) {
      const std::string what = o.json_keys.size() > 1 ? " (key '" + o.json_keys[k] + "')" : std::string();
      if (total_shards[k] > 0) {
        std::printf("preprocess_data: %lld shard(s)%s: %s ... %s\n", total_shards[k], what.c_str(),
                    trident::shard_final_name(prefixes[k], 0).c_str(),
                    trident::shard_final_name(prefixes[k], total_shards[k] - 1).c_str());
      } else {
        std::printf("preprocess_data: warning: the input holds no document with text%s; no shard written\n",
                    what.c_str());
      }
    }
    if (stale > 0)
      std::printf("preprocess_data: removed %d stale shard(s) of an earlier run with this prefix\n", stale);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return trident::run_app(argc, argv, run); }
