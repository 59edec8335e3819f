#include "checkpoint/hf_convert.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf_format.hpp"
#include "common/error.hpp"
#include "io/deck.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;

namespace trident {

namespace {

constexpr std::int64_t kPart = 1 << 24;  // values per part of a streamed tensor

std::string shape_text(const std::vector<std::int64_t>& s) { return nlohmann::json(s).dump(); }

std::int64_t inner_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Refuses an output file that exists (unless overwrite).
void check_output_file(bool overwrite, const fs::path& f) {
  std::error_code ec;
  TRIDENT_REQUIRE(overwrite || !fs::exists(f, ec),
                  "convert_checkpoint: '" << f.string() << "' exists (pass --overwrite to replace it)");
}

void check_output_dir(const std::string& dir) {
  std::error_code ec;
  TRIDENT_REQUIRE(!fs::exists(dir, ec) || fs::is_directory(dir, ec),
                  "convert_checkpoint: --output '" << dir << "' exists and is not a directory");
}

void make_output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TRIDENT_REQUIRE(!ec, "convert_checkpoint: cannot create '" << dir << "': " << ec.message());
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

nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  TRIDENT_REQUIRE(in, "convert_checkpoint: cannot read " << what << " '" << path << "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error::all("convert_checkpoint: " + std::string(what) + " '" + path + "' is not JSON (" + e.what() + ")");
  }
}

// The model weights of a checkpoint file: its tensors, or, for a checkpoint of LoRA adapters, its
// base model's with W + scale B A for every adapted projection (in double, rounded once; B's rows
// and W's at the same global rows, A's columns W's columns, in every tensor-parallel layout).
class WeightSource {
 public:
  explicit WeightSource(const std::string& file) : file_(std::make_unique<CheckpointFileReader>(file, "")) {
    deck_ = parse_stored_deck(file_->deck());
    const std::string base = file_->attribute("lora_base");
    if (base.empty()) return;
    std::error_code ec;
    TRIDENT_REQUIRE(fs::exists(base, ec), "convert_checkpoint: " << file << " holds LoRA adapters over the base model '"
                                                                 << base << "', which does not exist");
    base_ = std::make_unique<CheckpointFileReader>(base, file_->model());
    const std::string want = file_->attribute("lora_base_digest"), have = checkpoint_digest(base, MPI_COMM_SELF);
    TRIDENT_REQUIRE(want == have, "convert_checkpoint: the base model '" << base << "' is not the one the adapters of "
                                                                         << file << " were trained on (its digest "
                                                                         << have << " differs from the recorded "
                                                                         << want << ")");
    scale_ = static_cast<float>((deck_.lora.alpha > 0 ? deck_.lora.alpha : static_cast<double>(deck_.lora.rank)) /
                                static_cast<double>(deck_.lora.rank));
  }
  const CheckpointFileReader& file() const { return *file_; }
  const Deck& deck() const { return deck_; }
  bool adapters() const { return base_ != nullptr; }
  const std::string& base_path() const { return base_->path(); }
  float scale() const { return scale_; }
  const CheckpointFileReader& weights() const { return base_ ? *base_ : *file_; }
  bool has(const std::string& name) const { return weights().has(name); }
  std::vector<std::int64_t> shape(const std::string& name) const { return weights().shape(name); }
  // The plain model's tensors (the base's, under adapters).
  std::vector<std::string> tensors() const { return weights().tensors("model/"); }
  // The projection whose adapters merge into tensor `name`, or "".
  std::string adapted(const std::string& name) const {
    if (!base_ || !ends_with(name, "/weight")) return "";
    const std::string proj = name.substr(0, name.size() - 7);
    return file_->has(proj + "/lora_a") ? proj : "";
  }
  int merged() const { return merged_; }

  void read(const std::string& name, const CheckpointFileReader::Visit& f) const {
    const std::string proj = adapted(name);
    if (proj.empty()) {
      weights().read(name, f);
      return;
    }
    const auto sa = file_->shape(proj + "/lora_a"), sb = file_->shape(proj + "/lora_b"), sw = shape(name);
    TRIDENT_REQUIRE(sa.size() == 2 && sb.size() == 2 && sw.size() == 2 && sb[1] == sa[0] && sw[0] == sb[0] &&
                        sw[1] == sa[1],
                    "convert_checkpoint: the adapters of " << proj << " (" << shape_text(sa) << ", " << shape_text(sb)
                                                           << ") do not match its weight " << shape_text(sw));
    const std::vector<float> a = file_->read_all(proj + "/lora_a"), b = file_->read_all(proj + "/lora_b");
    const std::int64_t r = sa[0], in = sa[1];
    std::vector<float> w;
    weights().read(name, [&](std::int64_t r0, std::int64_t rows, const float* v) {
      w.assign(v, v + rows * in);
      for (std::int64_t o = 0; o < rows; ++o)
        for (std::int64_t i = 0; i < in; ++i) {
          double acc = 0;
          for (std::int64_t k = 0; k < r; ++k) acc += static_cast<double>(b[(r0 + o) * r + k]) * a[k * in + i];
          w[o * in + i] = static_cast<float>(static_cast<double>(w[o * in + i]) + scale_ * acc);
        }
      f(r0, rows, w.data());
    });
    ++merged_;
  }
  std::vector<float> read_all(const std::string& name) const {
    const auto s = shape(name);
    const std::int64_t inner = inner_of(s);
    std::vector<float> out(static_cast<size_t>(inner * (s.empty() ? 1 : s[0])));
    read(name, [&](std::int64_t r0, std::int64_t rows, const float* v) {
      std::copy(v, v + rows * inner, out.begin() + r0 * inner);
    });
    return out;
  }

 private:
  std::unique_ptr<CheckpointFileReader> file_, base_;
  Deck deck_;
  float scale_ = 1.f;
  mutable int merged_ = 0;
};

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
        TRIDENT_REQUIRE(s.find('/') == std::string::npos,
                        "convert_checkpoint: '" << index.string() << "' names a shard outside the directory: " << s);
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
  std::optional<std::pair<const SafetensorsReader*, const SafeTensorEntry*>> find(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end() && name.rfind("transformer.", 0) == 0) it = by_name.find(name.substr(12));
    if (it == by_name.end()) return std::nullopt;
    return it->second;
  }
  // Whether tensors a and b hold the same values (compared in parts).
  bool equal(const std::string& a, const std::string& b) const {
    const auto ea = find(a), eb = find(b);
    if (!ea || !eb || ea->second->shape != eb->second->shape) return false;
    const std::int64_t n = ea->second->numel();
    std::vector<float> x, y;
    for (std::int64_t at = 0; at < n; at += kPart) {
      const std::int64_t m = std::min(kPart, n - at);
      x.resize(static_cast<size_t>(m));
      y.resize(static_cast<size_t>(m));
      ea->first->read_f32(*ea->second, at, m, x.data());
      eb->first->read_f32(*eb->second, at, m, y.data());
      if (x != y) return false;
    }
    return true;
  }
};

// The tokenizer files an import copies beside the checkpoint, when the input has them.
constexpr const char* kTokenizerFiles[] = {"vocab.json",
                                           "merges.txt",
                                           "vocab.txt",
                                           "tokenizer.json",
                                           "tokenizer.model",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json"};

}  // namespace

std::string export_hf(const HfConvertOptions& o) {
  const std::string file = resolve_checkpoint(o.input);
  WeightSource src(file);
  const std::string model = src.file().model();
  const Deck& deck = src.deck();
  const HfFamily fam = hf_export_family(model, deck, o.architecture);
  const std::string dtype = safetensors_dtype(o.dtype);
  TRIDENT_REQUIRE(src.has("model/embedding/word_embeddings"),
                  "convert_checkpoint: " << file << " has no model/embedding/word_embeddings");
  const std::int64_t vocab = src.shape("model/embedding/word_embeddings")[0];
  const std::vector<HfTensor> map = hf_tensor_map(fam, deck, vocab);
  std::set<std::string> mapped;
  for (const auto& t : map) {
    TRIDENT_REQUIRE(src.has(t.trident), "convert_checkpoint: " << file << " has no " << t.trident);
    TRIDENT_REQUIRE(src.shape(t.trident) == t.shape,
                    "convert_checkpoint: " << file << ": " << t.trident << " is " << shape_text(src.shape(t.trident))
                                           << ", its deck says " << shape_text(t.shape));
    mapped.insert(t.trident);
  }
  for (const auto& n : src.tensors())
    TRIDENT_REQUIRE(mapped.count(n),
                    "convert_checkpoint: " << n << " has no Hugging Face name in " << hf_model_type(fam));
  // the tokenizer: GPT-2's BPE files (GPT-2, and a Llama-family model trained on them) or BERT's
  // WordPiece vocabulary, from the options or the checkpoint's deck
  const std::string vocab_file = o.vocab_file.empty() ? deck.data.vocab_file : o.vocab_file;
  const std::string merge_file = o.merge_file.empty() ? deck.data.merges_file : o.merge_file;
  std::vector<std::pair<std::string, std::string>> tokenizer;  // (source, name in the output)
  std::error_code ec;
  if (fam == HfFamily::MegatronBert) {
    TRIDENT_REQUIRE(!vocab_file.empty(),
                    "convert_checkpoint: the checkpoint's deck names no vocabulary: give "
                    "--vocab-file");
    tokenizer = {{vocab_file, "vocab.txt"}};
  } else if (fam == HfFamily::Gpt2 || !vocab_file.empty() || !merge_file.empty()) {
    TRIDENT_REQUIRE(!vocab_file.empty(),
                    "convert_checkpoint: the checkpoint's deck names no vocabulary: give "
                    "--vocab-file and --merge-file (the GPT-2 BPE files)");
    TRIDENT_REQUIRE(!merge_file.empty(), "convert_checkpoint: a GPT export needs --merge-file (the BPE merges)");
    tokenizer = {{vocab_file, "vocab.json"}, {merge_file, "merges.txt"}};
  }
  for (const auto& t : tokenizer)
    TRIDENT_REQUIRE(fs::is_regular_file(t.first, ec),
                    "convert_checkpoint: " << (t.second == "merges.txt" ? "merges" : "vocabulary") << " '" << t.first
                                           << "' is not a file");
  // the shards, in Hugging Face's tensor order
  std::vector<SafeTensorSpec> specs;
  std::map<std::string, std::pair<const HfTensor*, size_t>> source;  // hf name -> (entry, block)
  for (const auto& t : map)
    for (size_t i = 0; i < t.hf.size(); ++i) {
      specs.push_back({t.hf[i], t.hf_shape(i)});
      source[t.hf[i]] = {&t, i};
    }
  const auto groups = plan_safetensors_shards(specs, safetensors_dtype_size(dtype), o.shard_bytes);
  const fs::path out(o.output);
  check_output_dir(o.output);
  for (size_t g = 0; g < groups.size(); ++g)
    check_output_file(o.overwrite, out / safetensors_shard_name(g, groups.size()));
  if (groups.size() > 1) check_output_file(o.overwrite, out / "model.safetensors.index.json");
  for (const char* f : {"config.json", "tokenizer_config.json"}) check_output_file(o.overwrite, out / f);
  for (const auto& t : tokenizer) check_output_file(o.overwrite, out / t.second);
  std::int64_t eod = -1;
  if (!tokenizer.empty() && tokenizer[0].second == "vocab.json") {
    // GPT-2's end-of-text token: the vocabulary's <|endoftext|>
    const nlohmann::json v = read_json_file(vocab_file, "vocabulary");
    TRIDENT_REQUIRE(v.is_object() && static_cast<std::int64_t>(v.size()) == vocab,
                    "convert_checkpoint: vocabulary '" << vocab_file << "' holds " << v.size()
                                                       << " tokens but the model " << vocab);
    if (v.contains("<|endoftext|>")) eod = v["<|endoftext|>"].get<std::int64_t>();
  }
  make_output_dir(o.output);
  // each Hugging Face tensor streamed from its Trident tensor
  auto emit = [&](const std::string& hf_name, SafetensorsWriter& w) {
    const auto& [t, block] = source.at(hf_name);
    const std::int64_t inner = inner_of(t->shape);
    auto checked = [&](const float* v, std::int64_t n) {
      if (dtype == "F16")
        for (std::int64_t i = 0; i < n; ++i)
          TRIDENT_REQUIRE(std::fabs(v[i]) <= 65504.f, "convert_checkpoint: " << t->trident << " holds " << v[i]
                                                                             << ", beyond fp16's range: export as "
                                                                                "fp32 or bf16");
      w.put(v, n);
    };
    if (t->layout == HfLayout::Transposed) {
      const std::vector<float> v = src.read_all(t->trident);
      const std::int64_t r = t->shape[0], c = t->shape[1];
      std::vector<float> tr(v.size());
      for (std::int64_t i = 0; i < r; ++i)
        for (std::int64_t j = 0; j < c; ++j) tr[j * r + i] = v[i * c + j];
      checked(tr.data(), r * c);
      return;
    }
    const std::int64_t a = t->layout == HfLayout::RowBlocks ? t->row0(block) : 0;
    const std::int64_t b = t->layout == HfLayout::RowBlocks ? a + t->rows[block] : (t->shape.empty() ? 1 : t->shape[0]);
    src.read(t->trident, [&](std::int64_t r0, std::int64_t rows, const float* v) {
      const std::int64_t lo = std::max(a, r0), hi = std::min(b, r0 + rows);
      if (lo < hi) checked(v + (lo - r0) * inner, (hi - lo) * inner);
    });
  };
  std::map<std::string, std::string> weight_map;
  std::uint64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string name = safetensors_shard_name(g, groups.size());
    SafetensorsWriter w((out / name).string(),
                        std::vector<SafeTensorSpec>(specs.begin() + groups[g].first, specs.begin() + groups[g].second),
                        dtype,
                        {{"format", "pt"},
                         {"trident_checkpoint", file},
                         {"trident_iteration", std::to_string(src.file().iteration())},
                         {"trident_dtype", src.file().dtype()}});
    for (const auto& spec : w.order()) {
      emit(spec.name, w);
      weight_map[spec.name] = name;
    }
    w.commit();
    total += w.data_bytes();
  }
  if (groups.size() > 1)
    write_text_atomically(out / "model.safetensors.index.json", safetensors_index_json(weight_map, total));
  for (const auto& t : tokenizer) copy_file_atomically(t.first, out / t.second);
  nlohmann::ordered_json tc;
  if (fam == HfFamily::MegatronBert) {
    tc = {{"tokenizer_class", "BertTokenizer"}, {"model_max_length", deck.model.max_position_embeddings}};
  } else if (!tokenizer.empty()) {
    tc = {{"tokenizer_class", "GPT2Tokenizer"},
          {"model_max_length", deck.model.max_position_embeddings},
          {"bos_token", "<|endoftext|>"},
          {"eos_token", "<|endoftext|>"},
          {"unk_token", "<|endoftext|>"}};
  } else {
    tc = {{"model_max_length", deck.model.max_position_embeddings}};
  }
  write_text_atomically(out / "tokenizer_config.json", tc.dump(2) + "\n");
  // config.json last: a directory with a config is a complete export
  const std::string torch_dtype = dtype == "F32" ? "float32" : dtype == "BF16" ? "bfloat16" : "float16";
  write_text_atomically(out / "config.json", hf_config_json(fam, deck, vocab, eod, torch_dtype));
  std::ostringstream os;
  if (src.adapters())
    os << "convert_checkpoint: merged the LoRA adapters (rank " << deck.lora.rank << ", scale " << src.scale()
       << ") of " << src.merged() << " projections into the base model " << src.base_path() << "\n";
  os << "convert_checkpoint: " << file << " (iteration " << src.file().iteration() << ", " << src.file().dtype() << " "
     << model << ") -> " << o.output << ": " << hf_model_type(fam) << ", " << specs.size() << " tensors as " << dtype
     << " in " << groups.size() << " file(s), config.json";
  for (const auto& t : tokenizer) os << ", " << t.second;
  return os.str();
}

std::string import_hf(const HfConvertOptions& o) {
  const fs::path in(o.input), out(o.output);
  std::error_code ec;
  TRIDENT_REQUIRE(fs::is_directory(in, ec), "convert_checkpoint: --input '" << o.input << "' is not a directory");
  check_output_dir(o.output);
  check_output_file(o.overwrite, out / "latest");
  check_output_file(o.overwrite, out / "iter_0000000");
  check_output_file(o.overwrite, out / "model.ini");
  std::vector<std::string> tokenizer;  // files copied beside the checkpoint
  for (const char* f : kTokenizerFiles)
    if (fs::is_regular_file(in / f, ec)) {
      check_output_file(o.overwrite, out / f);
      tokenizer.push_back(f);
    }
  const fs::path cfg = in / "config.json";
  std::ifstream cf(cfg);
  TRIDENT_REQUIRE(cf, "convert_checkpoint: cannot read '" << cfg.string() << "'");
  std::stringstream text;
  text << cf.rdbuf();
  const HfWeights w(in);
  HfModelFacts facts;
  facts.binary_head = w.find("cls.seq_relationship.weight").has_value();
  const std::string ini = deck_from_hf_config(text.str(), cfg.string(), o.seq_length, facts);
  const Deck deck = parse_stored_deck(ini);
  const std::vector<HfTensor> map = hf_tensor_map(facts.family, deck, facts.vocab_size);
  // every tensor the model needs, of the config's shape; nothing left over but buffers and tied
  // copies
  std::set<std::string> used;
  for (const auto& t : map)
    for (size_t i = 0; i < t.hf.size(); ++i) {
      const auto e = w.find(t.hf[i]);
      TRIDENT_REQUIRE(e, "convert_checkpoint: '" << o.input << "' has no tensor " << t.hf[i]);
      TRIDENT_REQUIRE(e->second->shape == t.hf_shape(i),
                      "convert_checkpoint: " << e->first->path() << ", tensor " << e->second->name << ": shape "
                                             << shape_text(e->second->shape) << ", the model needs "
                                             << shape_text(t.hf_shape(i)));
      used.insert(e->second->name);
    }
  const std::string embeddings = map.front().hf[0];
  for (const auto& [name, e] : w.by_name) {
    if (used.count(name)) continue;
    const std::string bare = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (ends_with(bare, ".attn.bias") || ends_with(bare, ".attn.masked_bias") ||
        bare == "bert.embeddings.position_ids" || ends_with(bare, ".rotary_emb.inv_freq"))
      continue;  // buffers, not weights
    if (name == "lm_head.weight" || name == "cls.predictions.decoder.weight") {
      TRIDENT_REQUIRE(w.equal(name, embeddings),
                      "convert_checkpoint: " << name
                                             << " differs from the word embeddings: untied output weights, but the "
                                                "config ties them (tie_word_embeddings)");
      continue;
    }
    if (name == "cls.predictions.decoder.bias") {
      TRIDENT_REQUIRE(w.equal(name, "cls.predictions.bias"),
                      "convert_checkpoint: cls.predictions.decoder.bias differs from cls.predictions.bias");
      continue;
    }
    throw Error::all("convert_checkpoint: " + e.first->path() + " holds " + name + ", which has no place in " +
                     hf_model_type(facts.family) + " as Trident builds it");
  }
  CheckpointState st;
  st.model = facts.model;
  st.dtype = "fp32";
  st.seed = deck.train.seed;
  st.deck = deck.to_ini();
  make_output_dir(o.output);
  CheckpointFileWriter ck(o.output, st);
  for (const auto& t : map) {
    const std::int64_t inner = inner_of(t.shape);
    std::vector<float> whole;  // a transposed tensor, converted whole
    ck.write(t.trident, t.shape, [&](std::int64_t r0, std::int64_t rows, float* dst) {
      if (t.layout == HfLayout::Transposed) {
        if (whole.empty()) {
          const auto e = w.find(t.hf[0]);
          const std::vector<float> tr = e->first->read_f32(*e->second);
          const std::int64_t r = t.shape[0], c = t.shape[1];
          whole.resize(tr.size());
          for (std::int64_t i = 0; i < r; ++i)
            for (std::int64_t j = 0; j < c; ++j) whole[i * c + j] = tr[j * r + i];
        }
        std::copy(whole.begin() + r0 * inner, whole.begin() + (r0 + rows) * inner, dst);
        return;
      }
      for (size_t i = 0; i < t.hf.size(); ++i) {  // the block(s) that rows [r0, r0 + rows) cross
        const std::int64_t a = t.layout == HfLayout::RowBlocks ? t.row0(i) : 0;
        const std::int64_t b = t.layout == HfLayout::RowBlocks ? a + t.rows[i] : (t.shape.empty() ? 1 : t.shape[0]);
        const std::int64_t lo = std::max(a, r0), hi = std::min(b, r0 + rows);
        if (lo >= hi) continue;
        const auto e = w.find(t.hf[i]);
        e->first->read_f32(*e->second, (lo - a) * inner, (hi - lo) * inner, dst + (lo - r0) * inner);
      }
    });
  }
  const std::string written = ck.commit();
  // the model's deck keys, to start a deck for this checkpoint (eval.only, fine-tuning)
  write_text_atomically(out / "model.ini", "# " + o.input + " (convert_checkpoint)\n" + ini);
  std::string extra = ", model.ini";
  for (const auto& f : tokenizer) {
    copy_file_atomically((in / f).string(), out / f);
    extra += ", " + std::string(f);
  }
  std::ostringstream os;
  os << "convert_checkpoint: " << o.input << " (" << hf_model_type(facts.family) << ", " << deck.model.num_layers
     << " layers, hidden " << deck.model.hidden_size << ", vocabulary " << facts.vocab_size << ") -> " << written
     << extra;
  return os.str();
}

std::string merge_lora(const HfConvertOptions& o) {
  const std::string file = resolve_checkpoint(o.input);
  WeightSource src(file);
  TRIDENT_REQUIRE(src.adapters(), "convert_checkpoint: " << file << " holds plain weights, no LoRA adapters to merge");
  const fs::path out(o.output);
  check_output_dir(o.output);
  check_output_file(o.overwrite, out / "latest");
  const std::int64_t it = src.file().iteration();
  check_output_file(o.overwrite, out / iter_dir_name(it));
  Deck plain = src.deck();
  plain.lora = Deck::Lora{};
  plain.checkpoint.finetune = false;
  CheckpointState st;
  st.model = src.file().model();
  st.iteration = it;
  st.consumed_samples = src.file().int_attribute("consumed_samples");
  st.seed = src.deck().train.seed;
  st.dtype = "fp32";
  st.deck = plain.to_ini();
  make_output_dir(o.output);
  CheckpointFileWriter ck(o.output, st);
  for (const auto& name : src.tensors()) {
    const auto shape = src.shape(name);
    const std::int64_t inner = inner_of(shape);
    const std::vector<float> all = src.read_all(name);  // one tensor at a time
    ck.write(name, shape, [&](std::int64_t r0, std::int64_t rows, float* dst) {
      std::copy(all.begin() + r0 * inner, all.begin() + (r0 + rows) * inner, dst);
    });
  }
  const std::string written = ck.commit();
  std::ostringstream os;
  os << "convert_checkpoint: merged the LoRA adapters (rank " << src.deck().lora.rank << ", scale " << src.scale()
     << ") of " << src.merged() << " projections into the base model " << src.base_path() << "\n"
     << "convert_checkpoint: " << file << " (LoRA adapters, iteration " << it << ") over " << src.base_path() << " -> "
     << written << " (plain " << st.model << " weights, fp32)";
  return os.str();
}

}  // namespace trident
