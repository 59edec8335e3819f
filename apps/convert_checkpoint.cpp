// convert_checkpoint: Trident checkpoints <-> Hugging Face model directories (docs/DESIGN.md
// "Hugging Face format"), GPT as GPT2LMHeadModel and BERT as MegatronBertForPreTraining.
//
//   convert_checkpoint --to hf --input runs/gpt_small/checkpoints --output hf/gpt_small \
//       --vocab-file data/sample/gpt2/encoder.json --merge-file data/sample/gpt2/vocab.bpe
//   convert_checkpoint --to trident --input hf/gpt2 --output runs/gpt2_imported
//   convert_checkpoint --to merged --input runs/gpt_lora/checkpoints --output runs/gpt_lora_merged
//
// Export (--to hf): the input is a save directory (its `latest`), an iter_* directory or a
// checkpoint.h5 of any layout and precision; the output directory receives config.json,
// model.safetensors (the model's values: in a 16-bit run the 16-bit values, widened; --dtype
// stores them as fp32, bf16 or fp16), and the tokenizer (GPT: vocab.json and merges.txt, BERT:
// vocab.txt) from --vocab-file / --merge-file or the checkpoint deck's data keys.
// Import (--to trident): the input is a Hugging Face directory (config.json and
// model.safetensors, or model.safetensors.index.json and its shards); the output is a save
// directory holding iter_0000000/checkpoint.h5 (fp32, no optimizer state) and `latest`, which
// loads under any tp/pp/dp (checkpoint.finetune, eval.only, generate_gpt), model.ini (the
// model's deck keys) and the tokenizer files found in the input.
// A checkpoint of LoRA adapters (lora.rank > 0) is merged first: each adapted projection's weight
// becomes W + (alpha / rank) B A, computed in double and rounded once, over the base model the
// adapters were trained on. Merge (--to merged): such a checkpoint to a save directory of plain
// weights (GPT, BERT or T5; fp32, no optimizer state; the deck without lora keys), which loads
// anywhere a pretrained checkpoint does.
// Runs on one process. Outputs are refused when they exist (--overwrite replaces them), before
// anything is read or written; every file is written under a temporary name and renamed.
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf_format.hpp"
#include "comm/agreement.hpp"
#include "comm/communicator.hpp"
#include "comm/topology.hpp"
#include "common/error.hpp"
#include "io/deck.hpp"
#include "io/safetensors.hpp"
#include "runtime/app_driver.hpp"
#include "train/model_setup.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace trident;

namespace {

struct Options {
  std::string to, input, output, dtype = "fp32", vocab_file, merge_file;
  std::int64_t seq_length = 0;
  bool overwrite = false;
};

std::optional<Options> parse_options(int argc, char** argv, int rank) {
  Options o;
  po::options_description desc(
      "convert_checkpoint: Trident checkpoints <-> Hugging Face directories (GPT: GPT2LMHeadModel, BERT: "
      "MegatronBertForPreTraining)");
  desc.add_options()("help,h", "print this help")(
      "to", po::value(&o.to)->required(),
      "hf (export a Trident checkpoint), trident (import) or merged (LoRA adapters merged into plain weights)")(
      "input", po::value(&o.input)->required(),
      "--to hf, merged: a save directory, iter_* directory or checkpoint.h5; --to trident: a Hugging Face "
      "directory")("output", po::value(&o.output)->required(),
                   "the directory to write (created; must not hold output files)")(
      "dtype", po::value(&o.dtype)->default_value("fp32"), "--to hf: the stored weights' type: fp32, bf16 or fp16")(
      "vocab-file", po::value(&o.vocab_file),
      "--to hf: the tokenizer vocabulary (GPT: encoder.json / vocab.json, BERT: vocab.txt); default: the deck's "
      "data.vocab_file")("merge-file", po::value(&o.merge_file),
                         "--to hf, GPT: the BPE merges (vocab.bpe / merges.txt); default: the deck's data.merges_file")(
      "seq-length", po::value(&o.seq_length)->default_value(0),
      "--to trident: model.seq_length of the stored deck (0: the position table's length)")(
      "overwrite", po::bool_switch(&o.overwrite), "replace output files that exist");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    if (vm.count("help")) {
      if (rank == 0) std::cout << desc;
      return std::nullopt;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error::all(std::string("convert_checkpoint: ") + e.what() + " (see --help)");
  }
  TRIDENT_REQUIRE(o.to == "hf" || o.to == "trident" || o.to == "merged",
                  "convert_checkpoint: --to must be hf, trident or merged, not '" << o.to << "'");
  TRIDENT_REQUIRE(o.seq_length >= 0, "convert_checkpoint: --seq-length must be >= 0");
  o.dtype = safetensors_dtype(o.dtype);
  return o;
}

// Refuses an output file that exists (unless --overwrite) and an output that is the input.
void check_output_file(const Options& o, const fs::path& f) {
  std::error_code ec;
  TRIDENT_REQUIRE(o.overwrite || !fs::exists(f, ec),
                  "convert_checkpoint: '" << f.string() << "' exists (pass --overwrite to replace it)");
}

void copy_file_atomically(const std::string& from, const fs::path& to) {
  std::error_code ec;
  const fs::path tmp = to.string() + ".tmp";
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
  TRIDENT_REQUIRE(!ec,
                  "convert_checkpoint: cannot copy '" << from << "' to '" << tmp.string() << "': " << ec.message());
  fs::rename(tmp, to, ec);
  TRIDENT_REQUIRE(!ec, "convert_checkpoint: cannot rename '" << tmp.string() << "': " << ec.message());
}

void write_text_atomically(const fs::path& to, const std::string& text) {
  const fs::path tmp = to.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    TRIDENT_REQUIRE(out, "convert_checkpoint: cannot write '" << tmp.string() << "'");
  }
  std::error_code ec;
  fs::rename(tmp, to, ec);
  TRIDENT_REQUIRE(!ec, "convert_checkpoint: cannot rename '" << tmp.string() << "': " << ec.message());
}

ModelFamily family_of(const std::string& model, bool any = false) {
  if (model == "gpt") return ModelFamily::Gpt;
  if (model == "bert") return ModelFamily::Bert;
  if (any && model == "t5") return ModelFamily::T5;
  throw Error::all("convert_checkpoint: a " + model +
                   " checkpoint has no Hugging Face counterpart here (GPT and BERT are converted)");
}

// A one-rank model of `deck` (any stored layout, built at tp = pp = dp = 1, fp32) over `store`.
struct OneRankModel {
  Topology topo;
  ParamStore store;
  std::vector<std::unique_ptr<LanguageModel>> chunks;
  TransformerConfig cfg;
  ModelFamily fam;
  OneRankModel(Deck deck, const std::string& model, std::int64_t vocab) : topo(MPI_COMM_WORLD, 1, 1) {
    deck.parallel = Deck::Parallel{};
    deck.precision.dtype = "fp32";
    deck.precision.recompute = "none";
    fam = family_of(model, true);
    cfg = make_config(deck, vocab, 1, fam);
    cfg.hidden_dropout = cfg.attention_dropout = 0.f;
    chunks = build_chunks(fam, cfg, head_options(deck), store, 1, tensor_parallel(deck, topo),
                          chunks_of(deck, topo, cfg));
    store.allocate();
  }
};

// Host index of each element of parameter `p`'s global tensor, in row-major order (at tp = 1 the
// local tensor less the vocabulary padding; fused row blocks such as q|k|v kept in place).
std::vector<std::int64_t> global_to_host(const ParamInfo& p) {
  const std::int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const std::int64_t grows = p.global_shape[0], gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
  std::int64_t covered = 0;
  for (const auto& b : p.blocks) covered += b.rows;
  TRIDENT_REQUIRE(cols == gcols && rows >= grows && covered == grows,
                  "convert_checkpoint: unexpected one-rank layout of " << p.name);
  std::vector<std::int64_t> at;
  at.reserve(static_cast<size_t>(grows * gcols));
  for (const auto& b : p.blocks)  // at one rank the blocks follow each other in the global tensor
    for (std::int64_t r = 0; r < b.rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) at.push_back(p.offset + (b.local0 + r) * cols + c);
  return at;
}

// A JSON file, or one error naming it.
nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  TRIDENT_REQUIRE(in, "convert_checkpoint: cannot read " << what << " '" << path << "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error::all("convert_checkpoint: " + std::string(what) + " '" + path + "' is not JSON (" + e.what() + ")");
  }
}

std::int64_t word_embedding_rows(std::string file) {
  // the unpadded vocabulary: the rows of the stored word embeddings (of the base model under
  // LoRA adapters)
  if (const std::string base = checkpoint_lora_base(file, MPI_COMM_WORLD); !base.empty()) file = base;
  std::int64_t v = 0;
  collectively(MPI_COMM_WORLD, [&] {
    const auto dims = checkpoint_tensor_shape(file, "model/embedding/word_embeddings");
    TRIDENT_REQUIRE(dims.size() == 2, "checkpoint '" << file << "': model/embedding/word_embeddings is not 2-D");
    v = dims[0];
  });
  return v;
}

// The model weights of checkpoint `file` in m.store: a plain checkpoint's, or LoRA adapters over
// their base model, merged: W += scale B A for every adapted projection (one-rank layout: local =
// global, fused q|k|v row blocks in place in both W and B), in double, rounded once.
CheckpointState load_merged(const std::string& file, const std::string& model, const Deck& deck, std::int64_t vocab,
                            OneRankModel& m) {
  const CheckpointState st = load_model_weights(file, model.c_str(), m.fam, m.cfg, head_options(deck), vocab, m.store,
                                                m.topo);
  if (!m.store.has_adapters()) return st;
  HostFloatView host = m.store.model_to_host();
  const std::string tail = "/lora_a";
  int merged = 0;
  for (const ParamInfo& pa : m.store.params()) {
    if (!pa.adapter || pa.name.size() <= tail.size() ||
        pa.name.compare(pa.name.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string proj = pa.name.substr(0, pa.name.size() - tail.size());
    const ParamId ib = m.store.find(proj + "/lora_b"), iw = m.store.find(proj + "/weight");
    TRIDENT_REQUIRE(ib >= 0 && iw >= 0, "convert_checkpoint: " << pa.name << " has no lora_b or weight beside it");
    const ParamInfo &pb = m.store.info(ib), &pw = m.store.info(iw);
    const std::int64_t r = pa.shape[0], in = pa.shape[1], out = pb.shape[0];
    TRIDENT_REQUIRE(pb.shape[1] == r && pw.shape[0] == out && pw.shape[1] == in,
                    "convert_checkpoint: the adapters of " << proj << " do not match its weight");
    const float* a = host.data() + pa.offset;
    const float* b = host.data() + pb.offset;
    float* w = host.data() + pw.offset;
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (std::int64_t k = 0; k < r; ++k) acc += static_cast<double>(b[o * r + k]) * a[k * in + i];
        w[o * in + i] = static_cast<float>(static_cast<double>(w[o * in + i]) + m.cfg.lora_scale * acc);
      }
    ++merged;
  }
  m.store.model_from_host(host);
  std::printf(
      "convert_checkpoint: merged the LoRA adapters (rank %lld, scale %g) of %d projections into the base "
      "model %s\n",
      static_cast<long long>(m.cfg.lora_rank), static_cast<double>(m.cfg.lora_scale), merged, st.lora_base.c_str());
  return st;
}

int export_hf(const Options& o) {
  const std::string file = resolve_checkpoint(o.input);
  const std::string model = checkpoint_model_kind(file, MPI_COMM_WORLD);
  family_of(model);
  const Deck deck = parse_stored_deck(read_checkpoint_deck(file, model, MPI_COMM_WORLD));
  const std::string vocab_file = o.vocab_file.empty() ? deck.data.vocab_file : o.vocab_file;
  const std::string merge_file = o.merge_file.empty() ? deck.data.merges_file : o.merge_file;
  const fs::path out(o.output);
  std::vector<std::pair<std::string, std::string>> tokenizer;  // (source, name in the output)
  collectively(MPI_COMM_WORLD, [&] {
    std::error_code ec;
    TRIDENT_REQUIRE(!vocab_file.empty(),
                    "convert_checkpoint: the checkpoint's deck names no vocabulary: give --vocab-file"
                        << (model == "gpt" ? " and --merge-file (the GPT-2 BPE files)" : ""));
    TRIDENT_REQUIRE(fs::is_regular_file(vocab_file, ec),
                    "convert_checkpoint: vocabulary '" << vocab_file << "' is not a file");
    if (model == "gpt") {
      TRIDENT_REQUIRE(!merge_file.empty(), "convert_checkpoint: a GPT export needs --merge-file (the BPE merges)");
      TRIDENT_REQUIRE(fs::is_regular_file(merge_file, ec),
                      "convert_checkpoint: merges '" << merge_file << "' is not a file");
      tokenizer = {{vocab_file, "vocab.json"}, {merge_file, "merges.txt"}};
    } else {
      tokenizer = {{vocab_file, "vocab.txt"}};
    }
    TRIDENT_REQUIRE(!fs::exists(out, ec) || fs::is_directory(out, ec),
                    "convert_checkpoint: --output '" << o.output << "' exists and is not a directory");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"}) check_output_file(o, out / f);
    for (const auto& t : tokenizer) check_output_file(o, out / t.second);
  });
  const std::int64_t vocab = word_embedding_rows(file);
  OneRankModel m(deck, model, vocab);
  const CheckpointState st = load_merged(file, model, deck, vocab, m);
  const HostFloatView host = m.store.model_to_host();
  std::vector<SafeTensorOut> tensors;
  std::set<std::string> mapped;
  const bool binary_head = head_options(deck).binary_head;
  for (const auto& t : hf_tensor_map(model, deck.model.num_layers, model == "bert" && binary_head)) {
    const ParamId id = m.store.find(t.trident);
    TRIDENT_REQUIRE(id >= 0, "convert_checkpoint: the model has no " << t.trident);
    const ParamInfo& p = m.store.info(id);
    std::vector<float> v;
    for (std::int64_t i : global_to_host(p)) v.push_back(host(i));
    if (o.dtype == "F16")
      for (float x : v)
        TRIDENT_REQUIRE(std::fabs(x) <= 65504.f,
                        "convert_checkpoint: " << t.trident << " holds " << x
                                               << ", beyond fp16's range: export as fp32 or bf16");
    for (auto& h : to_hf(t, p.global_shape, v)) tensors.push_back(std::move(h));
    mapped.insert(t.trident);
  }
  for (const auto& p : m.store.params())
    TRIDENT_REQUIRE(p.tied_copy || p.adapter || mapped.count(p.name),
                    "convert_checkpoint: " << p.name << " has no Hugging Face name");
  std::int64_t eod = -1;
  if (model == "gpt") {
    // GPT-2's end-of-text token: the vocabulary's <|endoftext|>
    const nlohmann::json v = read_json_file(vocab_file, "vocabulary");
    TRIDENT_REQUIRE(v.is_object() && static_cast<std::int64_t>(v.size()) == vocab,
                    "convert_checkpoint: vocabulary '" << vocab_file << "' holds " << v.size()
                                                       << " tokens but the model " << vocab);
    if (v.contains("<|endoftext|>")) eod = v["<|endoftext|>"].get<std::int64_t>();
  }
  const std::string torch_dtype = o.dtype == "F32" ? "float32" : o.dtype == "BF16" ? "bfloat16" : "float16";
  std::error_code ec;
  fs::create_directories(out, ec);
  TRIDENT_REQUIRE(!ec, "convert_checkpoint: cannot create '" << o.output << "': " << ec.message());
  write_safetensors((out / "model.safetensors").string(), tensors, o.dtype,
                    {{"format", "pt"},
                     {"trident_checkpoint", file},
                     {"trident_iteration", std::to_string(st.iteration)},
                     {"trident_dtype", st.dtype}});
  for (const auto& t : tokenizer) copy_file_atomically(t.first, out / t.second);
  nlohmann::ordered_json tc;
  if (model == "gpt") {
    tc = {{"tokenizer_class", "GPT2Tokenizer"},
          {"model_max_length", deck.model.max_position_embeddings},
          {"bos_token", "<|endoftext|>"},
          {"eos_token", "<|endoftext|>"},
          {"unk_token", "<|endoftext|>"}};
  } else {
    tc = {{"tokenizer_class", "BertTokenizer"}, {"model_max_length", deck.model.max_position_embeddings}};
  }
  write_text_atomically(out / "tokenizer_config.json", tc.dump(2) + "\n");
  // config.json last: a directory with a config is a complete export
  write_text_atomically(out / "config.json", hf_config_json(model, deck, vocab, eod, torch_dtype));
  std::printf("convert_checkpoint: %s (iteration %lld, %s %s) -> %s: %zu tensors as %s, config.json, %s\n",
              file.c_str(), static_cast<long long>(st.iteration), st.dtype.c_str(), model.c_str(), o.output.c_str(),
              tensors.size(), o.dtype.c_str(), model == "gpt" ? "vocab.json, merges.txt" : "vocab.txt");
  return 0;
}

// The tensors of a Hugging Face directory: model.safetensors, or the shards that
// model.safetensors.index.json's weight_map names.
struct HfWeights {
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafeTensorEntry*>> by_name;
  explicit HfWeights(const fs::path& dir) {
    std::error_code ec;
    const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    std::vector<std::string> names;
    if (fs::exists(single, ec)) {
      names.push_back(single.string());
    } else if (fs::exists(index, ec)) {
      const nlohmann::json j = read_json_file(index.string(), "index");
      TRIDENT_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                      "convert_checkpoint: '" << index.string() << "' has no weight_map");
      std::set<std::string> shards;
      for (const auto& f : j["weight_map"]) {
        TRIDENT_REQUIRE(f.is_string(),
                        "convert_checkpoint: '" << index.string() << "': weight_map values are file names");
        const std::string s = f.get<std::string>();
        TRIDENT_REQUIRE(s.find('/') == std::string::npos, "convert_checkpoint: '" << index.string()
                                                                                  << "' names a shard outside "
                                                                                     "the directory: "
                                                                                  << s);
        shards.insert(s);
      }
      for (const auto& s : shards) names.push_back((dir / s).string());
    } else {
      const bool bin = fs::exists(dir / "pytorch_model.bin", ec);
      throw Error::all("convert_checkpoint: '" + dir.string() + "' holds neither model.safetensors nor " +
                       "model.safetensors.index.json" +
                       (bin ? " (only pytorch_model.bin, a Python pickle: save the model with "
                              "save_pretrained(..., safe_serialization=True) first)"
                            : ""));
    }
    for (const auto& n : names) {
      files.push_back(std::make_unique<SafetensorsReader>(n));
      for (const auto& t : files.back()->tensors()) {
        TRIDENT_REQUIRE(!by_name.count(t.name),
                        "convert_checkpoint: tensor '" << t.name << "' appears twice (" << n << ")");
        by_name[t.name] = {files.back().get(), &t};
      }
    }
  }
  // The entry of `name`, also without GPT2LMHeadModel's "transformer." prefix (the published
  // gpt2 weights have none).
  std::optional<std::pair<std::string, std::pair<const SafetensorsReader*, const SafeTensorEntry*>>> find(
      const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end() && name.rfind("transformer.", 0) == 0) it = by_name.find(name.substr(12));
    if (it == by_name.end()) return std::nullopt;
    return *it;
  }
  std::vector<float> read(const std::string& name) const {
    auto e = find(name);
    return e->second.first->read_f32(*e->second.second);
  }
};

int import_hf(const Options& o) {
  const fs::path in(o.input), out(o.output);
  std::string ini;
  HfModelFacts facts;
  std::unique_ptr<HfWeights> w;
  std::vector<std::string> tokenizer;  // files copied beside the checkpoint
  collectively(MPI_COMM_WORLD, [&] {
    std::error_code ec;
    TRIDENT_REQUIRE(fs::is_directory(in, ec), "convert_checkpoint: --input '" << o.input << "' is not a directory");
    TRIDENT_REQUIRE(!fs::exists(out, ec) || fs::is_directory(out, ec),
                    "convert_checkpoint: --output '" << o.output << "' exists and is not a directory");
    check_output_file(o, out / "latest");
    check_output_file(o, out / "iter_0000000");
    check_output_file(o, out / "model.ini");
    for (const char* f : {"vocab.json", "merges.txt", "vocab.txt"})
      if (fs::is_regular_file(in / f, ec)) {
        check_output_file(o, out / f);
        tokenizer.push_back(f);
      }
    const fs::path cfg = in / "config.json";
    std::ifstream cf(cfg);
    TRIDENT_REQUIRE(cf, "convert_checkpoint: cannot read '" << cfg.string() << "'");
    std::stringstream text;
    text << cf.rdbuf();
    w = std::make_unique<HfWeights>(in);
    facts.binary_head = w->find("cls.seq_relationship.weight").has_value();
    ini = deck_from_hf_config(text.str(), cfg.string(), o.seq_length, facts);
  });
  const Deck deck = parse_stored_deck(ini);
  OneRankModel m(deck, facts.model, facts.vocab_size);
  HostFloatView host(std::string("convert::host"), static_cast<size_t>(m.store.padded_size()));
  std::set<std::string> used;
  auto get = [&](const std::string& name, const std::vector<std::int64_t>& shape) {
    const auto e = w->find(name);
    TRIDENT_REQUIRE(e, "convert_checkpoint: '" << o.input << "' has no tensor " << name);
    const auto& t = *e->second.second;
    TRIDENT_REQUIRE(t.shape == shape, "convert_checkpoint: " << e->second.first->path() << ", tensor " << t.name
                                                             << ": shape " << nlohmann::json(t.shape).dump()
                                                             << ", the model needs " << nlohmann::json(shape).dump());
    used.insert(t.name);
    return e->second.first->read_f32(t);
  };
  std::set<std::string> mapped;
  for (const auto& t : hf_tensor_map(facts.model, deck.model.num_layers, facts.binary_head)) {
    const ParamId id = m.store.find(t.trident);
    TRIDENT_REQUIRE(id >= 0, "convert_checkpoint: the model has no " << t.trident);
    const ParamInfo& p = m.store.info(id);
    const std::vector<float> v = from_hf(t, p.global_shape, get);
    for (float x : v) TRIDENT_REQUIRE(std::isfinite(x), "convert_checkpoint: " << t.hf[0] << " holds " << x);
    const auto at = global_to_host(p);
    for (size_t i = 0; i < at.size(); ++i) host(at[i]) = v[i];
    mapped.insert(t.trident);
  }
  for (const auto& p : m.store.params())
    TRIDENT_REQUIRE(p.tied_copy || mapped.count(p.name),
                    "convert_checkpoint: nothing in '" << o.input << "' gives " << p.name);
  // Tensors left over: the tied output weights (must equal the word embeddings), buffers, or
  // something Trident's model has no place for (refused).
  const std::string wte = facts.model == "gpt" ? "transformer.wte.weight" : "bert.embeddings.word_embeddings.weight";
  for (const auto& [name, e] : w->by_name) {
    if (used.count(name)) continue;
    const std::string bare = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    auto ends_with = [&](const std::string& tail) {
      return bare.size() > tail.size() && bare.compare(bare.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool buffer = ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
                        bare == "bert.embeddings.position_ids";
    if (buffer) continue;
    if (name == "lm_head.weight" || name == "cls.predictions.decoder.weight") {
      TRIDENT_REQUIRE(e.first->read_f32(*e.second) == w->read(wte),
                      "convert_checkpoint: " << name
                                             << " differs from the word embeddings: untied output weights, "
                                                "which Trident's models do not have");
      continue;
    }
    if (name == "cls.predictions.decoder.bias") {
      TRIDENT_REQUIRE(e.first->read_f32(*e.second) == w->read("cls.predictions.bias"),
                      "convert_checkpoint: cls.predictions.decoder.bias differs from cls.predictions.bias");
      continue;
    }
    throw Error::all("convert_checkpoint: " + e.first->path() + " holds " + name +
                     ", which has no place in Trident's " + facts.model + " model");
  }
  m.store.model_from_host(host);
  CheckpointState st;
  st.model = facts.model;
  st.dtype = "fp32";
  st.seed = deck.train.seed;
  st.deck = deck.to_ini();
  std::error_code ec;
  fs::create_directories(out, ec);
  TRIDENT_REQUIRE(!ec, "convert_checkpoint: cannot create '" << o.output << "': " << ec.message());
  const std::string written = save_checkpoint(o.output, st, m.store, nullptr, m.topo);
  // the model's deck keys, to start a deck for this checkpoint (eval.only, fine-tuning)
  write_text_atomically(out / "model.ini", "# " + o.input + " (convert_checkpoint)\n" + ini);
  std::string extra = ", model.ini";
  for (const auto& f : tokenizer) {
    copy_file_atomically((in / f).string(), out / f);
    extra += ", " + f;
  }
  std::printf("convert_checkpoint: %s (%s, %lld layers, hidden %lld, vocabulary %lld) -> %s%s\n", o.input.c_str(),
              facts.model.c_str(), static_cast<long long>(deck.model.num_layers),
              static_cast<long long>(deck.model.hidden_size), static_cast<long long>(facts.vocab_size), written.c_str(),
              extra.c_str());
  return 0;
}

// --to merged: LoRA adapters merged into their base model, saved as plain weights.
int merge_lora(const Options& o) {
  const std::string file = resolve_checkpoint(o.input);
  const std::string model = checkpoint_model_kind(file, MPI_COMM_WORLD);
  const Deck deck = parse_stored_deck(read_checkpoint_deck(file, model, MPI_COMM_WORLD));
  const fs::path out(o.output);
  collectively(MPI_COMM_WORLD, [&] {
    TRIDENT_REQUIRE(deck.lora.rank > 0,
                    "convert_checkpoint: " << file << " holds plain weights, no LoRA adapters to merge");
    std::error_code ec;
    TRIDENT_REQUIRE(!fs::exists(out, ec) || fs::is_directory(out, ec),
                    "convert_checkpoint: --output '" << o.output << "' exists and is not a directory");
    check_output_file(o, out / "latest");
  });
  const std::int64_t vocab = word_embedding_rows(file);
  OneRankModel m(deck, model, vocab);
  const CheckpointState st = load_merged(file, model, deck, vocab, m);
  // the plain model: the base model's parameters, by name, from the merged store
  Deck plain_deck = deck;
  plain_deck.lora = Deck::Lora{};
  plain_deck.checkpoint.finetune = false;
  OneRankModel plain(plain_deck, model, vocab);
  const HostFloatView from = m.store.model_to_host();
  HostFloatView to = plain.store.model_to_host();
  for (const ParamInfo& p : plain.store.params()) {
    const ParamId id = m.store.find(p.name);
    TRIDENT_REQUIRE(id >= 0 && m.store.info(id).numel() == p.numel(),
                    "convert_checkpoint: internal: " << p.name << " differs between the adapted and the plain model");
    for (std::int64_t i = 0; i < p.numel(); ++i) to(p.offset + i) = from(m.store.info(id).offset + i);
  }
  plain.store.model_from_host(to);
  CheckpointState ps;
  ps.model = model;
  ps.iteration = st.iteration;
  ps.consumed_samples = st.consumed_samples;
  ps.seed = deck.train.seed;
  ps.dtype = "fp32";
  ps.deck = plain_deck.to_ini();
  collectively(MPI_COMM_WORLD, [&] {
    std::error_code ec;
    TRIDENT_REQUIRE(o.overwrite || !fs::exists(out / iter_dir_name(st.iteration), ec),
                    "convert_checkpoint: '" << (out / iter_dir_name(st.iteration)).string()
                                            << "' exists (pass --overwrite to replace it)");
    fs::create_directories(out, ec);
    TRIDENT_REQUIRE(!ec, "convert_checkpoint: cannot create '" << o.output << "': " << ec.message());
  });
  const std::string written = save_checkpoint(o.output, ps, plain.store, nullptr, plain.topo);
  std::printf("convert_checkpoint: %s (LoRA adapters, iteration %lld) over %s -> %s (plain %s weights, fp32)\n",
              file.c_str(), static_cast<long long>(st.iteration), st.lora_base.c_str(), written.c_str(), model.c_str());
  return 0;
}

int run(int argc, char** argv) {
  const Communicator world(MPI_COMM_WORLD);
  std::optional<Options> o = parse_options(argc, argv, world.rank());
  if (!o) return 0;
  TRIDENT_REQUIRE(world.size() == 1,
                  "convert_checkpoint runs on one process (got " << world.size() << "): run it without mpiexec -n");
  return o->to == "hf" ? export_hf(*o) : o->to == "merged" ? merge_lora(*o) : import_hf(*o);
}

}  // namespace

int main(int argc, char** argv) { return run_app(argc, argv, run); }
