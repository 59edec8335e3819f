// convert_dataset: Trident HDF5 token shards <-> Megatron indexed datasets (.bin/.idx), lossless
// both ways (tokens, document and sentence boundaries; the special tokens come from the
// shards' attributes or, for Megatron input, from the tokenizer flags). docs/DESIGN.md
// "Megatron indexed datasets".
//
//   convert_dataset --input 'shards/kjv_*.h5' --output-prefix megatron/kjv_text_document
//   convert_dataset --input megatron/pile_text_document --output-prefix shards/pile \
//       --tokenizer-type GPT2BPETokenizer --vocab-file gpt2/encoder.json --merge-file gpt2/vocab.bpe
//
// Each input file (an HDF5 shard, or a Megatron pair named by its prefix or either file)
// becomes one output: <prefix>.{bin,idx} or <prefix>.h5 for one input, <prefix>_NNNNN.* (in
// input order) for several. Each output is written under a temporary name and renamed when
// complete. Under mpiexec the ranks take whole inputs round-robin.
#include <Kokkos_Core.hpp>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "comm/agreement.hpp"
#include "comm/communicator.hpp"
#include "common/error.hpp"
#include "data/corpus.hpp"
#include "data/indexed_dataset.hpp"
#include "data/token_shard.hpp"
#include "runtime/app_driver.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using trident::Error;

namespace {

struct Options {
  std::vector<std::string> inputs;
  std::string output_prefix, to, dtype = "auto", tokenizer_type, vocab_file, merge_file, tokenizer_model;
  int vocab_extra_ids = 0;
  bool overwrite = false;
};

std::optional<Options> parse_options(int argc, char** argv, int rank) {
  Options o;
  po::options_description desc(
      "convert_dataset: Trident HDF5 token shards <-> Megatron indexed datasets (.bin/.idx)\n"
      "usage: convert_dataset --input FILES... --output-prefix PREFIX [--to megatron|hdf5] "
      "[--tokenizer-type T --vocab-file V --merge-file M]\noptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help")
    ("input", po::value<std::vector<std::string>>(&o.inputs)->multitoken(),
     "HDF5 shards, Megatron prefixes (P for P.bin + P.idx) or globs (quote them); all of one format")
    ("output-prefix", po::value<std::string>(&o.output_prefix),
     "<prefix>.bin/.idx or <prefix>.h5 for one input, <prefix>_NNNNN.* for several")
    ("to", po::value<std::string>(&o.to), "megatron or hdf5 (default: the other format of the input)")
    ("dtype", po::value<std::string>(&o.dtype)->default_value("auto"),
     "Megatron token type: auto (Megatron's rule: uint16 below a vocabulary of 65500, else int32), uint16, int32")
    ("tokenizer-type", po::value<std::string>(&o.tokenizer_type),
     "tokenizer of Megatron input (which records none): preprocess_data's names; checked against HDF5 input")
    ("vocab-file", po::value<std::string>(&o.vocab_file), "the tokenizer's vocabulary")
    ("merge-file", po::value<std::string>(&o.merge_file), "BPE merges (BPE tokenizers)")
    ("tokenizer-model", po::value<std::string>(&o.tokenizer_model),
     "HuggingFaceTokenizer: its tokenizer.json; SentencePieceTokenizer: its .model file")
    ("vocab-extra-ids", po::value<int>(&o.vocab_extra_ids)->default_value(0), "T5 sentinels (as preprocess_data)")
    ("overwrite", po::bool_switch(&o.overwrite), "replace existing outputs (refused otherwise)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error::all(std::string("convert_dataset: ") + e.what() + " (see --help)");
  }
  if (vm.count("help")) {
    if (rank == 0) std::cout << desc << std::endl;
    return std::nullopt;
  }
  TRIDENT_REQUIRE(!o.inputs.empty(), "convert_dataset: --input is required");
  TRIDENT_REQUIRE(!o.output_prefix.empty(), "convert_dataset: --output-prefix is required");
  TRIDENT_REQUIRE(o.to.empty() || o.to == "megatron" || o.to == "hdf5",
                  "convert_dataset: --to '" << o.to << "' is not megatron or hdf5");
  TRIDENT_REQUIRE(o.dtype == "auto" || o.dtype == "uint16" || o.dtype == "int32",
                  "convert_dataset: --dtype '" << o.dtype << "' is not auto, uint16 or int32");
  return o;
}

// The output file(s) of input k of n (the .idx names a Megatron pair).
std::vector<std::string> outputs_of(const Options& o, bool to_megatron, std::size_t k, std::size_t n) {
  std::string p = o.output_prefix;
  if (n > 1) {
    char tail[16];
    std::snprintf(tail, sizeof tail, "_%05zu", k);
    p += tail;
  }
  if (to_megatron) return {p, p + ".bin", p + ".idx"};
  return {p + ".h5", p + ".h5"};
}

// Document d of `in`: its tokens, and its sentence ends (relative to its start; none without
// sentences). s: the position in the sentence offsets, carried from document to document.
void read_document(const trident::TokenShardReader& in, std::int64_t d, std::int64_t& s,
                   std::vector<std::int32_t>& tokens, std::vector<std::int64_t>& ends) {
  const auto& doc = in.document_offsets();
  const auto& sent = in.sentence_offsets();
  const std::int64_t begin = doc[d], end = doc[d + 1];
  tokens.resize(static_cast<std::size_t>(end - begin));
  in.read(begin, end - begin, tokens.data());
  ends.clear();
  if (sent.empty()) return;
  while (s < sent.size() && sent[s] <= begin) ++s;
  for (; s < sent.size() && sent[s] <= end; ++s)
    if (ends.empty() || sent[s] - begin > ends.back()) ends.push_back(sent[s] - begin);  // repeats: empty sequences
  --s;  // the document's end starts the next one
}

// Every document of `in`, with its sentence ends, into writer w (either format); then close().
template <class Writer>
void copy_documents(const trident::TokenShardReader& in, Writer& w) {
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> ends;
  for (std::int64_t d = 0, s = 0; d + 1 < in.document_offsets().size(); ++d) {
    read_document(in, d, s, tokens, ends);
    w.add_document(tokens, ends);
  }
  w.close();
}

void to_megatron(const trident::TokenShardReader& in, const std::string& prefix, const Options& o) {
  const auto& m = in.meta();
  trident::IndexedDtype dt = trident::megatron_optimal_dtype(m.vocab_size);
  if (o.dtype == "uint16") dt = trident::IndexedDtype::uint16;
  if (o.dtype == "int32") dt = trident::IndexedDtype::int32;
  TRIDENT_REQUIRE(dt != trident::IndexedDtype::uint16 || m.vocab_size <= 65536,
                  "convert_dataset: --dtype uint16 cannot hold the vocabulary of " << m.vocab_size << " of '" << m.path
                                                                                   << "'");
  trident::IndexedDatasetWriter w(prefix, dt);
  copy_documents(in, w);
}

void to_hdf5(const trident::TokenShardReader& in, const std::string& path) {
  const auto& m = in.meta();
  trident::TokenShardWriter w(path, m.tokenizer, m.vocab_size, m.eod_id, m.has_sentences);
  w.set_special_tokens(m.specials);
  w.set_tokenizer_digest(m.tokenizer_digest);
  copy_documents(in, w);
}

int run(int argc, char** argv) {
  const trident::Communicator world(MPI_COMM_WORLD);
  const int rank = world.rank(), nranks = world.size();
  std::optional<Options> parsed = parse_options(argc, argv, rank);
  if (!parsed) return 0;
  const Options& o = *parsed;

  // Inputs, all of one format; the output names, checked before anything is written.
  std::vector<std::string> inputs;
  bool from_megatron = false;
  std::optional<trident::TokenShardMeta> described;
  trident::collectively(world.get(), [&] {
    std::string spec;
    for (const auto& i : o.inputs) spec += i + " ";
    for (const auto& g : trident::parse_shard_spec(spec)) inputs.insert(inputs.end(), g.paths.begin(), g.paths.end());
    std::size_t megatron = 0;
    for (const auto& i : inputs) megatron += trident::indexed_dataset_prefix(i).empty() ? 0 : 1;
    TRIDENT_REQUIRE(megatron == 0 || megatron == inputs.size(),
                    "convert_dataset: the inputs mix Megatron pairs and HDF5 shards; convert one format at a time");
    from_megatron = megatron > 0;
    const std::string natural = from_megatron ? "hdf5" : "megatron";
    TRIDENT_REQUIRE(o.to.empty() || o.to == natural, "convert_dataset: --to "
                                                         << o.to << " but the inputs are already "
                                                         << (from_megatron ? "Megatron pairs" : "HDF5 shards"));
    described = trident::indexed_dataset_description(o.tokenizer_type, o.vocab_file, o.merge_file, o.vocab_extra_ids,
                                                     o.tokenizer_model);
    TRIDENT_REQUIRE(!from_megatron || described,
                    "convert_dataset: Megatron input records no tokenizer; give --tokenizer-type, --vocab-file "
                    "(and --merge-file, --vocab-extra-ids) as preprocess_data had");
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const auto outs = outputs_of(o, !from_megatron, k, inputs.size());
      for (std::size_t f = 1; f < outs.size(); ++f) {
        std::error_code ec;
        TRIDENT_REQUIRE(o.overwrite || !fs::exists(outs[f], ec),
                        "convert_dataset: '" << outs[f] << "' exists (pass --overwrite to replace it)");
        for (const auto& i : inputs)
          TRIDENT_REQUIRE(fs::weakly_canonical(outs[f], ec) != fs::weakly_canonical(i, ec),
                          "convert_dataset: output '" << outs[f] << "' is also an input");
      }
    }
    const fs::path parent = fs::path(o.output_prefix).parent_path();
    std::error_code ec;
    TRIDENT_REQUIRE(parent.empty() || fs::is_directory(parent, ec),
                    "convert_dataset: the directory of --output-prefix, '" << parent.string() << "', does not exist");
  });

  std::int64_t docs = 0, tokens = 0;
  trident::collectively(world.get(), [&] {
    for (std::size_t k = static_cast<std::size_t>(rank); k < inputs.size(); k += static_cast<std::size_t>(nranks)) {
      const trident::TokenShardReader in(inputs[k], described ? &*described : nullptr);
      const auto& m = in.meta();
      if (!from_megatron && described)
        TRIDENT_REQUIRE(m.tokenizer == described->tokenizer && m.vocab_size == described->vocab_size &&
                            (m.tokenizer_digest.empty() || m.tokenizer_digest == described->tokenizer_digest),
                        "convert_dataset: '" << m.path << "' holds " << m.tokenizer << " tokens (vocab_size "
                                             << m.vocab_size << "), not those of the --tokenizer-type "
                                             << described->tokenizer << " (vocab_size " << described->vocab_size
                                             << ") and its files");
      const auto outs = outputs_of(o, !from_megatron, k, inputs.size());
      if (from_megatron)
        to_hdf5(in, outs[0]);
      else
        to_megatron(in, outs[0], o);
      docs += m.num_documents;
      tokens += m.num_tokens;
      std::printf("[rank %d] %s -> %s: %lld documents, %lld tokens%s\n", rank, m.path.c_str(), outs[0].c_str(),
                  static_cast<long long>(m.num_documents), static_cast<long long>(m.num_tokens),
                  m.has_sentences ? " (with sentences)" : "");
      std::fflush(stdout);
    }
  });
  docs = world.allreduce_sum(docs);
  tokens = world.allreduce_sum(tokens);
  if (rank == 0)
    std::printf("convert_dataset: %zu input(s), %lld documents, %lld tokens written as %s\n", inputs.size(),
                static_cast<long long>(docs), static_cast<long long>(tokens),
                from_megatron ? "HDF5 token shards" : "Megatron indexed datasets");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return trident::run_app(argc, argv, run); }
