// GPT pretraining loop:
//   for each iteration: zero grads; for each micro-batch of this DP rank: forward+backward
//   (gradients of the global mean loss accumulate); all-reduce gradients over DP; global grad
//   norm; clip; AdamW; log; evaluate; checkpoint.
// Samples of an iteration, global order: micro-step k, DP rank r, slot j ->
//   sample consumed + (k * dp + r) * micro_batch + j   (Megatron's pretraining sampler).
#include "train/gpt_training.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "comm/topology.hpp"
#include "common/error.hpp"
#include "common/progress.hpp"
#include "common/timer.hpp"
#include "data/bert_dataset.hpp"
#include "data/gpt_dataset.hpp"
#include "data/t5_dataset.hpp"
#include "data/token_shard.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_handle.hpp"
#include "io/metrics.hpp"
#include "models/gpt_model.hpp"
#include "ops/gemm.hpp"
#include "optim/adamw.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/lr_schedule.hpp"
#include "train/memory_report.hpp"
#include "train/output_checks.hpp"
#include "train/grad_reducer.hpp"
#include "train/pipeline.hpp"
#include "train/prefetcher.hpp"
#include "train/stop_signal.hpp"
#include "train/watchdog.hpp"
#include "train/pipeline_schedule.hpp"
#include "ops/elementwise.hpp"

namespace trident {

namespace {

// "a, b,c" -> {"a", "b", "c"} (empty items dropped)
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

std::int64_t pad_vocab(std::int64_t v, std::int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

std::string hms(double s) {
  if (!(s >= 0) || s > 1e8) return "--:--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}

// The model families of the pretraining loop.
enum class Family { Gpt, Bert, T5 };
const char* family_name(Family f) { return f == Family::Bert ? "bert" : f == Family::T5 ? "t5" : "gpt"; }
GptConfig make_config(const Deck& d, std::int64_t vocab, std::int64_t tp, Family family = Family::Gpt);

}  // namespace

GptConfig gpt_config_from_deck(const Deck& d, std::int64_t vocab, std::int64_t tp) { return make_config(d, vocab, tp); }

namespace {

// A checkpoint continues (or seeds) this run only if it holds the same model: every dimension
// that shapes the weights, compared from the deck stored in the checkpoint. Tensor shapes alone
// would let fewer layers (the extra ones dropped) or other head counts (same shapes) through.
// Returns the table of differences, or "" when the checkpoint holds this model (collective; a
// checkpoint whose deck cannot be read throws).
std::string model_differences(const std::string& file, const char* family, Family fam, const GptConfig& want,
                              std::int64_t vocab, const Topology& topo) {
  const Deck saved_deck = parse_deck_text(read_checkpoint_deck(file, family, topo.world().get()));
  const GptConfig got = make_config(saved_deck, vocab, topo.tp_size(), fam);
  struct Row {
    const char* key;
    std::int64_t saved, run;
  };
  std::vector<Row> rows = {{"model.num_layers", got.num_layers, want.num_layers},
                           {"model.hidden_size", got.hidden, want.hidden},
                           {"model.num_heads", got.heads, want.heads},
                           {"model.ffn_hidden_size", got.ffn, want.ffn},
                           {"model.max_position_embeddings", got.max_positions, want.max_positions}};
  if (want.t5) rows.push_back({"model.decoder_num_layers", got.decoder_layers, want.decoder_layers});
  if (want.bert) rows.push_back({"bert.binary_head", got.binary_head ? 1 : 0, want.binary_head ? 1 : 0});
  if (saved_deck.model.vocab_size > 0)
    rows.push_back({"model.vocab_size", saved_deck.model.vocab_size, want.vocab_size});
  std::ostringstream table;
  bool differ = false;
  table << "checkpoint " << file << " holds another model than this run's:\n  "
        << std::left << std::setw(32) << "key" << std::right << std::setw(12) << "checkpoint" << std::setw(12) << "this run";
  for (const Row& r : rows) {
    if (r.saved == r.run) continue;
    differ = true;
    table << "\n  " << std::left << std::setw(32) << r.key << std::right << std::setw(12) << r.saved << std::setw(12) << r.run;
  }
  return differ ? table.str() : std::string();
}

void check_same_model(const std::string& file, const char* family, Family fam, const GptConfig& want,
                      std::int64_t vocab, const Topology& topo) {
  const std::string diff = model_differences(file, family, fam, want, vocab, topo);
  TRIDENT_REQUIRE(diff.empty(), diff);
}

// Rank 0's list of checkpoint files, on every rank.
std::vector<std::string> broadcast_list(std::vector<std::string> list, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string joined;
  for (const auto& s : list) joined += s + '\n';
  int n = static_cast<int>(joined.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  joined.resize(static_cast<std::size_t>(n));
  MPI_Bcast(joined.data(), n, MPI_CHAR, 0, comm);
  list.clear();
  std::istringstream in(joined);
  for (std::string line; std::getline(in, line);) list.push_back(line);
  return list;
}

GptConfig make_config(const Deck& d, std::int64_t vocab, std::int64_t tp, Family family) {
  GptConfig c;
  c.bert = family == Family::Bert;
  c.t5 = family == Family::T5;
  if (c.t5) {
    c.decoder_layers = d.model.decoder_num_layers > 0 ? d.model.decoder_num_layers : d.model.num_layers;
    c.decoder_seq_length = d.model.decoder_seq_length;
  }
  c.binary_head = d.bert.binary_head;
  c.num_layers = d.model.num_layers;
  c.hidden = d.model.hidden_size;
  c.heads = d.model.num_heads;
  c.ffn = d.model.ffn_hidden_size;
  c.seq_length = d.model.seq_length;
  c.max_positions = d.model.max_position_embeddings;
  c.vocab_size = vocab;
  c.padded_vocab = pad_vocab(vocab, d.model.make_vocab_size_divisible_by * tp);
  c.ln_eps = static_cast<float>(d.model.layernorm_epsilon);
  c.init_std = static_cast<float>(d.model.init_method_std);
  c.hidden_dropout = static_cast<float>(d.model.hidden_dropout);
  c.attention_dropout = static_cast<float>(d.model.attention_dropout);
  c.recompute = d.precision.recompute == "full"        ? GptConfig::Recompute::Full
                : d.precision.recompute == "selective" ? GptConfig::Recompute::Selective
                                                       : GptConfig::Recompute::None;
  c.recompute_block = d.precision.recompute_method == "block";
  c.recompute_num_layers = d.precision.recompute_num_layers;
  c.flash_attention = d.model.flash_attention;
  c.dt = d.precision.dtype == "bf16" ? DType::BF16 : d.precision.dtype == "fp16" ? DType::F16 : DType::F32;
  return c;
}

// Host staging of one micro-batch: B sample records of `width` ints each ->
//   GPT  (width S+1, a window): inputs window[0..S), targets window[1..S]
//   BERT (width 4S+1): tokens, types, labels, padding (S each), then the sentence-order label
//   T5   (width 2S+2Sd): encoder tokens, encoder padding (S each), decoder input, decoder
//        targets (Sd each; -1 at padding)
struct Batch {
  Batch(std::int64_t B, std::int64_t S, Family family, std::int64_t Sd = 0)
      : B(B), S(S), Sd(Sd), bert(family == Family::Bert), t5(family == Family::T5),
        width(bert ? 4 * S + 1 : t5 ? 2 * S + 2 * Sd : S + 1), window(static_cast<size_t>(B * width)),
        h_tokens("batch::h_tokens", B * S), h_targets("batch::h_targets", B * (t5 ? Sd : S)),
        h_types("batch::h_types", B * S), h_padding("batch::h_padding", B * S), h_order("batch::h_order", B),
        h_dec("batch::h_dec", B * Sd) {}
  void finish(std::int64_t vocab, MicroBatch& mb) {
    auto check = [&](std::int32_t id) {
      if (id < 0 || id >= vocab)
        throw Error::one("data: token id " + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(vocab));
    };
    std::int64_t labelled = 0, ordered = 0;
    for (std::int64_t j = 0; j < B && t5; ++j) {
      const std::int32_t* w = window.data() + j * width;
      for (std::int64_t t = 0; t < S; ++t) {
        check(w[t]);
        h_tokens(j * S + t) = w[t];
        h_padding(j * S + t) = w[S + t];
      }
      for (std::int64_t t = 0; t < Sd; ++t) {
        const std::int32_t in = w[2 * S + t], target = w[2 * S + Sd + t];
        check(in);
        if (target >= 0) {
          check(target);
          ++labelled;
        }
        h_dec(j * Sd + t) = in;
        h_targets(j * Sd + t) = target;
      }
    }
    if (t5) {
      Kokkos::deep_copy(mb.tokens, h_tokens);
      Kokkos::deep_copy(mb.padding, h_padding);
      Kokkos::deep_copy(mb.dec_tokens, h_dec);
      Kokkos::deep_copy(mb.targets, h_targets);
      mb.num_targets = labelled;
      return;
    }
    for (std::int64_t j = 0; j < B; ++j) {
      const std::int32_t* w = window.data() + j * width;
      for (std::int64_t t = 0; t < S; ++t) {
        if (!bert) {
          check(w[t]);
          check(w[t + 1]);
          h_tokens(j * S + t) = w[t];
          h_targets(j * S + t) = w[t + 1];
          continue;
        }
        check(w[t]);
        if (w[2 * S + t] >= 0) {
          check(w[2 * S + t]);
          ++labelled;
        }
        h_tokens(j * S + t) = w[t];
        h_types(j * S + t) = w[S + t];
        h_targets(j * S + t) = w[2 * S + t];
        h_padding(j * S + t) = w[3 * S + t];
      }
      if (bert) {
        h_order(j) = w[4 * S];
        if (w[4 * S] >= 0) ++ordered;
      }
    }
    Kokkos::deep_copy(mb.tokens, h_tokens);
    Kokkos::deep_copy(mb.targets, h_targets);
    if (!bert) return;
    Kokkos::deep_copy(mb.types, h_types);
    Kokkos::deep_copy(mb.padding, h_padding);
    Kokkos::deep_copy(mb.sentence_order, h_order);
    mb.num_targets = labelled;
    mb.num_sentences = ordered;
  }
  std::int64_t B, S, Sd;
  bool bert, t5;
  std::int64_t width;
  std::vector<std::int32_t> window;
  IntView::HostMirror h_tokens, h_targets, h_types, h_padding, h_order, h_dec;
};

// The samples of a run, as int32 records of Batch's width: GPT windows or BERT samples.
struct SampleSource {
  std::function<void(std::int64_t, std::int32_t*)> train, valid;  // sample i; valid may be empty
  std::int64_t vocab = 0;
  std::string description;
};

SampleSource gpt_samples(const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                         std::shared_ptr<void>& keep) {
  auto data = std::make_shared<GptData>(deck.data.train_shards, deck.data.split, deck.model.seq_length, train_samples,
                                        valid_samples, static_cast<std::uint64_t>(deck.train.seed));
  keep = data;
  SampleSource src;
  src.train = [d = data.get()](std::int64_t i, std::int32_t* out) { d->train().get(i, out); };
  if (data->valid()) src.valid = [d = data.get()](std::int64_t i, std::int32_t* out) { d->valid()->get(i, out); };
  src.vocab = data->vocab_size();
  src.description = data->describe();
  return src;
}

// The samples of a BERT or T5 dataset pair (train, optional valid), each record written by
// encode(dataset, i, out).
template <class Data, class Encode>
SampleSource masked_source(const std::shared_ptr<Data>& data, Encode encode) {
  SampleSource src;
  src.train = [d = data.get(), encode](std::int64_t i, std::int32_t* out) { encode(d->train(), i, out); };
  if (data->valid())
    src.valid = [d = data.get(), encode](std::int64_t i, std::int32_t* out) { encode(*d->valid(), i, out); };
  src.vocab = data->vocab_size();
  src.description = data->describe() + "\n";
  return src;
}

SampleSource bert_samples(const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                          std::shared_ptr<void>& keep) {
  BertMasking m;
  m.masked_lm_prob = deck.bert.mask_prob;
  m.short_seq_prob = deck.bert.short_seq_prob;
  m.max_ngrams = static_cast<int>(deck.bert.max_ngrams);
  m.binary_head = deck.bert.binary_head;
  auto data = std::make_shared<BertData>(deck.data.train_shards, deck.data.split, deck.model.seq_length,
                                         train_samples, valid_samples, static_cast<std::uint64_t>(deck.train.seed),
                                         deck.data.vocab_file, deck.data.merges_file, m);
  keep = data;
  const std::int64_t S = deck.model.seq_length;
  auto encode = [S](const BertDataset& ds, std::int64_t i, std::int32_t* out) {
    thread_local BertSample smp;  // the prefetcher's thread and the main thread each have one
    ds.get(i, smp);
    std::copy(smp.tokens.begin(), smp.tokens.end(), out);
    std::copy(smp.types.begin(), smp.types.end(), out + S);
    std::copy(smp.labels.begin(), smp.labels.end(), out + 2 * S);
    std::copy(smp.padding.begin(), smp.padding.end(), out + 3 * S);
    out[4 * S] = smp.is_random;
  };
  return masked_source(data, encode);
}

SampleSource t5_samples(const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                        std::shared_ptr<void>& keep) {
  T5Masking m;
  m.masked_prob = deck.t5.mask_prob;
  m.short_seq_prob = deck.t5.short_seq_prob;
  m.max_ngrams = static_cast<int>(deck.t5.max_ngrams);
  m.geometric_p = deck.t5.geometric_p;
  TRIDENT_REQUIRE(deck.model.decoder_seq_length > 0, "deck: model.decoder_seq_length must be > 0 for T5");
  auto data = std::make_shared<T5Data>(deck.data.train_shards, deck.data.split, deck.model.seq_length,
                                       deck.model.decoder_seq_length, train_samples, valid_samples,
                                       static_cast<std::uint64_t>(deck.train.seed), deck.data.vocab_file,
                                       deck.data.merges_file, m);
  keep = data;
  const std::int64_t S = deck.model.seq_length, Sd = deck.model.decoder_seq_length;
  auto encode = [S, Sd](const T5Dataset& ds, std::int64_t i, std::int32_t* out) {
    thread_local T5Sample smp;  // the prefetcher's thread and the main thread each have one
    ds.get(i, smp);
    std::copy(smp.enc.begin(), smp.enc.end(), out);
    std::copy(smp.enc_padding.begin(), smp.enc_padding.end(), out + S);
    std::copy(smp.dec_in.begin(), smp.dec_in.end(), out + 2 * S);
    std::copy(smp.dec_target.begin(), smp.dec_target.end(), out + 2 * S + Sd);
  };
  return masked_source(data, encode);
}

SampleSource samples_of(Family f, const Deck& deck, std::int64_t train_samples, std::int64_t valid_samples,
                        std::shared_ptr<void>& keep) {
  if (f == Family::Bert) return bert_samples(deck, train_samples, valid_samples, keep);
  if (f == Family::T5) return t5_samples(deck, train_samples, valid_samples, keep);
  return gpt_samples(deck, train_samples, valid_samples, keep);
}

// Rank 0 writes every global batch (validation): /iter_NNNNNNN int32 [GB, width], a row being one
// sample as its family encodes it (GPT: S+1 tokens; BERT: 4S+1; T5: 2S+2S_d; validation/README.md).
class BatchDumper {
 public:
  BatchDumper(const std::string& path, bool resume) : path_(path) {
    H5QuietErrors quiet;
    if (resume) file_ = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    if (!file_.valid()) file_ = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!file_.valid()) throw Error::one("debug.dump_batches: cannot create '" + path + "'");
  }
  void write(std::int64_t it, const std::vector<std::int32_t>& rows, std::int64_t n, std::int64_t w) {
    char name[32];
    std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(it));
    H5QuietErrors quiet;
    if (H5Lexists(file_, name, H5P_DEFAULT) > 0) H5Ldelete(file_, name, H5P_DEFAULT);
    hsize_t dims[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(w)};
    H5Handle sp = h5_space(H5Screate_simple(2, dims, nullptr));
    H5Handle ds = h5_dataset(H5Dcreate2(file_, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data());
    H5Fflush(file_, H5F_SCOPE_LOCAL);
  }

 private:
  std::string path_;
  H5Handle file_;
};

// debug.dump_dropout: the mask of every forward dropout call of a one-rank run, in call order, as
// /NNNNNNN uint8 datasets (1 kept, 0 dropped) with attributes site, layer, iteration and p. The
// masks come from the counter-based uniform the kernels evaluate (dropout_uniform(key, i) >= p).
// They are kept in memory during the forward passes and written by flush() between iterations:
// the data prefetcher reads shards through HDF5 on a helper thread meanwhile, and HDF5 is not
// thread-safe.
class DropoutTape {
 public:
  DropoutTape(const std::string& path, const std::int64_t* iteration) : iteration_(iteration) {
    H5QuietErrors quiet;
    file_ = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!file_.valid()) throw Error::one("debug.dump_dropout: cannot create '" + path + "'");
    set_dropout_recorder([this](const char* site, std::int64_t layer, const DropoutSpec& d,
                                const std::vector<std::int64_t>& shape) { record(site, layer, d, shape); });
  }
  ~DropoutTape() { set_dropout_recorder(nullptr); }
  DropoutTape(const DropoutTape&) = delete;
  DropoutTape& operator=(const DropoutTape&) = delete;

  void flush() {
    H5QuietErrors quiet;
    for (const Mask& m : pending_) {
      char name[32];
      std::snprintf(name, sizeof(name), "%07lld", static_cast<long long>(written_++));
      std::vector<hsize_t> dims(m.shape.begin(), m.shape.end());
      H5Handle sp = h5_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
      H5Handle ds = h5_dataset(H5Dcreate2(file_, name, H5T_STD_U8LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      if (!ds.valid() || H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.keep.data()) < 0)
        throw Error::one(std::string("debug.dump_dropout: cannot write mask ") + name);
      h5_write_attr(ds, "site", m.site);
      h5_write_attr(ds, "layer", m.layer);
      h5_write_attr(ds, "iteration", m.iteration);
      h5_write_attr(ds, "p", m.p);
    }
    pending_.clear();
    H5Fflush(file_, H5F_SCOPE_LOCAL);
  }

 private:
  struct Mask {
    std::string site;
    std::int64_t layer, iteration;
    double p;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> keep;
  };

  void record(const char* site, std::int64_t layer, const DropoutSpec& d, const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    Mask m{site, layer, *iteration_, static_cast<double>(d.p), shape, std::vector<std::uint8_t>(static_cast<size_t>(n))};
    for (std::int64_t i = 0; i < n; ++i)
      m.keep[static_cast<size_t>(i)] = dropout_uniform(d.key, static_cast<std::uint64_t>(i)) >= d.p;
    pending_.push_back(std::move(m));
  }

  H5Handle file_;
  const std::int64_t* iteration_;
  std::vector<Mask> pending_;
  std::int64_t written_ = 0;
};

TensorParallel tensor_parallel(const Deck& deck, const Topology& topo) {
  TensorParallel tp;
  tp.comm = &topo.tp_group();
  tp.sequence_parallel = deck.parallel.sequence_parallel && topo.tp_size() > 1;
  return tp;
}

// Global L2 norm of the gradients: TP-sharded parameters summed over the TP group, the
// replicated ones (identical on every TP rank by then) counted once, the stages summed over
// the pipeline group, tied copies (the last stage's word embeddings) left out. Each
// data-parallel rank sums the squares of its shard [begin, end) of the flat buffer and the
// partial sums are added over the DP group: the distributed optimizer holds only that shard of
// the reduced gradient, and the plain optimizer computes the same sum the same way (so both
// clip by the bitwise same factor).
double global_grad_norm(const ParamStore& store, const Topology& topo, std::int64_t begin, std::int64_t end) {
  double part[2] = {0, 0};  // sharded over TP, replicated over TP
  for (const auto& p : store.params()) {
    if (p.tied_copy) continue;
    const std::int64_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel());
    if (b >= e) continue;
    part[p.tp_replicated ? 1 : 0] += sum_squares(slice(store.grads(), b, e - b), e - b);
  }
  double sharded = topo.dp_group().allreduce_sum(part[0]), replicated = topo.dp_group().allreduce_sum(part[1]);
  sharded = topo.tp_group().allreduce_sum(sharded);
  return std::sqrt(topo.pp_group().allreduce_sum(sharded + replicated));
}

// This rank's part of the model: one stage's layers (embeddings on the first stage, final
// LayerNorm, head and loss on the last), or, with vp > 1, vp chunks: chunk c is virtual stage
// c * pp + pp_rank of an even split over pp * vp virtual stages.
// Layers (first, count) of each pipeline stage without interleaving. T5 with
// parallel.pipeline_split_rank = r (Megatron's split rank): the encoder's layers evenly over
// stages [0, r), the decoder's over [r, pp).
std::vector<std::pair<std::int64_t, std::int64_t>> stage_layers(const Deck& deck, int p, const GptConfig& cfg) {
  const std::int64_t r = deck.parallel.pipeline_split_rank;
  if (r == 0) return split_layers(cfg.total_layers(), p, deck.parallel.first_stage_layers, deck.parallel.last_stage_layers);
  TRIDENT_REQUIRE(cfg.t5, "parallel.pipeline_split_rank is for T5's encoder-decoder (pretrain_t5) only");
  TRIDENT_REQUIRE(r < p, "parallel.pipeline_split_rank (" << r << ") must be below parallel.pp (" << p
                                                          << "): stages [0, r) hold the encoder, [r, pp) the decoder");
  TRIDENT_REQUIRE(deck.parallel.first_stage_layers == 0 && deck.parallel.last_stage_layers == 0,
                  "parallel.pipeline_split_rank cannot be combined with parallel.first_stage_layers / last_stage_layers");
  const std::int64_t enc_stages = r, dec_stages = p - r;
  TRIDENT_REQUIRE(cfg.num_layers % enc_stages == 0,
                  "model.num_layers (" << cfg.num_layers << ", the encoder's) is not divisible by the "
                                       << enc_stages << " encoder stages of parallel.pipeline_split_rank");
  TRIDENT_REQUIRE(cfg.decoder_layers % dec_stages == 0,
                  "model.decoder_num_layers (" << cfg.decoder_layers << ") is not divisible by the " << dec_stages
                                               << " decoder stages (parallel.pp - parallel.pipeline_split_rank)");
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t k = 0; k < enc_stages; ++k) out.push_back({k * (cfg.num_layers / enc_stages), cfg.num_layers / enc_stages});
  for (std::int64_t k = 0; k < dec_stages; ++k)
    out.push_back({cfg.num_layers + k * (cfg.decoder_layers / dec_stages), cfg.decoder_layers / dec_stages});
  return out;
}

std::vector<GptStage> chunks_of(const Deck& deck, const Topology& topo, const GptConfig& cfg) {
  const std::int64_t L = cfg.total_layers();
  const int p = topo.pp_size(), s = topo.coords().pp, vp = static_cast<int>(deck.parallel.vp);
  std::vector<GptStage> out;
  if (vp == 1) {
    const auto split = stage_layers(deck, p, cfg);
    GptStage st;
    st.first_layer = split[s].first;
    st.num_layers = split[s].second;
    st.pre = topo.is_first_stage();
    st.post = topo.is_last_stage();
    return {st};
  }
  TRIDENT_REQUIRE(p > 1, "parallel.vp > 1 (interleaved schedule) needs parallel.pp > 1");
  TRIDENT_REQUIRE(!cfg.t5, "parallel.vp > 1: the interleaved schedule is not supported for T5's encoder-decoder "
                           "(as in Megatron-LM); use parallel.vp = 1");
  TRIDENT_REQUIRE(deck.parallel.first_stage_layers == 0 && deck.parallel.last_stage_layers == 0,
                  "parallel.first_stage_layers / last_stage_layers cannot be combined with parallel.vp > 1");
  TRIDENT_REQUIRE(L % (p * vp) == 0,
                  "model.num_layers (" << L << ") is not divisible by parallel.pp x parallel.vp = "
                                       << p << " x " << vp << " (the interleaved schedule's virtual stages)");
  const auto split = split_layers(L, p * vp, 0, 0);
  for (int c = 0; c < vp; ++c) {
    GptStage st;
    st.first_layer = split[c * p + s].first;
    st.num_layers = split[c * p + s].second;
    st.pre = c == 0 && s == 0;
    st.post = c == vp - 1 && s == p - 1;
    out.push_back(st);
  }
  return out;
}

// T5: the pipeline stage that holds the first decoder layer (vp = 1).
int decoder_stage(const Deck& deck, const Topology& topo, const GptConfig& cfg) {
  const auto split = stage_layers(deck, topo.pp_size(), cfg);
  for (int s = 0; s < topo.pp_size(); ++s)
    if (split[s].first <= cfg.num_layers && cfg.num_layers < split[s].first + split[s].second) return s;
  return topo.pp_size() - 1;
}

// The model chunks of this rank, sharing one parameter store.
std::vector<std::unique_ptr<GptModel>> build_chunks(const GptConfig& cfg, ParamStore& store, std::int64_t mbs,
                                                    const TensorParallel& tp, const std::vector<GptStage>& stages) {
  std::vector<std::unique_ptr<GptModel>> out;
  for (const auto& st : stages) out.push_back(std::make_unique<GptModel>(cfg, store, mbs, tp, st));
  return out;
}

std::vector<GptModel*> raw(const std::vector<std::unique_ptr<GptModel>>& v) {
  std::vector<GptModel*> out;
  for (auto& m : v) out.push_back(m.get());
  return out;
}

// The model of the evaluation mode, loaded from checkpoint.load, and its pipeline runner.
// Samples are dealt round-robin in blocks of micro_batch_size over the data-parallel ranks
// (the ranks of a tensor-parallel group score the same block together): block i of this rank
// starts at sample (dp_rank + i * dp) * B.
struct EvalModel {
  EvalModel(const Deck& deck, const Topology& topo, std::int64_t vocab, Family family)
      : cfg(make_config(deck, vocab, topo.tp_size(), family)), B(deck.train.micro_batch_size), dp(&topo.dp_group()) {
    store.set_dtype(cfg.dt);
    chunks = build_chunks(cfg, store, B, tensor_parallel(deck, topo), chunks_of(deck, topo, cfg));
    store.allocate();
    file = resolve_checkpoint(deck.checkpoint.load);
    state = load_checkpoint(file, family_name(family), store, nullptr, topo);
    runner = std::make_unique<PipelineRunner>(raw(chunks), topo);
    runner->grouped_p2p = deck.debug.grouped_p2p;
  }
  // blocks of B samples this rank scores out of n
  std::int64_t blocks(std::int64_t n) const {
    const std::int64_t nblocks = (n + B - 1) / B;
    return nblocks > dp->rank() ? (nblocks - 1 - dp->rank()) / dp->size() + 1 : 0;
  }
  GptConfig cfg;
  std::int64_t B;
  const Communicator* dp;
  ParamStore store;
  std::vector<std::unique_ptr<GptModel>> chunks;
  std::string file;
  CheckpointState state;
  std::unique_ptr<PipelineRunner> runner;
};

// BERT's losses of the chunks since the last call, summed over the pipeline and data-parallel
// groups (each value once per TP group: TP ranks hold the same losses).
BertLosses reduce_bert_losses(const std::vector<std::unique_ptr<GptModel>>& chunks, const Topology& topo) {
  BertLosses l;
  for (auto& chunk : chunks) l.add(chunk->take_bert_losses());
  double v[6] = {l.mlm, l.sop, l.mlm_sum, l.mlm_count, l.sop_sum, l.sop_count};
  for (double& x : v) x = topo.dp_group().allreduce_sum(topo.pp_group().allreduce_sum(x));
  return BertLosses{v[0], v[1], v[2], v[3], v[4], v[5]};
}

// BERT's and T5's evaluation mode: the first eval.windows samples of the dataset built from
// every document of eval.shard (train.seed, the deck's [bert] or [t5] masking), without
// dropout; the loss is the LM cross-entropy averaged over all labelled positions (T5: decoder
// targets) plus, for BERT, the sentence-order cross-entropy averaged over the samples
// (independent of the micro-batch size and layout).
int run_masked_eval_only(const Deck& deck, const Topology& topo, Family family) {
  const Communicator& world = topo.world();
  const std::int64_t S = deck.model.seq_length, N = deck.eval.windows, B = deck.train.micro_batch_size;
  TRIDENT_REQUIRE(N > 0, "eval.windows must be > 0 in evaluation mode (samples to score)");
  SampleSource data;
  std::shared_ptr<void> owner;
  collectively(world.get(), [&] {
    Deck d = deck;
    d.data.train_shards = deck.eval.shard;
    d.data.split = "1";
    data = samples_of(family, d, N, 0, owner);
  });
  EvalModel m(deck, topo, data.vocab, family);
  const bool t5 = family == Family::T5;
  const std::int64_t Sd = deck.model.decoder_seq_length;
  Batch batch(B, S, family, Sd);
  const Communicator& dpg = topo.dp_group();
  const GptConfig& cfg = m.cfg;
  m.runner->evaluate(
      m.blocks(N),
      [&](std::int64_t i, MicroBatch& mb) {
        const std::int64_t first = (dpg.rank() + i * dpg.size()) * B;
        for (std::int64_t j = 0; j < B; ++j) {
          std::int32_t* w = batch.window.data() + j * batch.width;
          data.train(std::min(first + j, N - 1), w);
          if (first + j >= N && t5) {  // padding of a short last block: nothing of it counts
            std::fill(w + 2 * S + Sd, w + 2 * S + 2 * Sd, -1);
          } else if (first + j >= N) {
            std::fill(w + 2 * S, w + 3 * S, -1);
            w[4 * S] = -1;
          }
        }
        batch.finish(data.vocab, mb);
      },
      [&](std::int64_t) { return B; });
  const BertLosses l = reduce_bert_losses(m.chunks, topo);
  const double mlm = l.mlm_sum / std::max(l.mlm_count, 1.0), sop = l.sop_sum / std::max(l.sop_count, 1.0);
  if (world.rank() == 0) {
    std::cout << "evaluated checkpoint " << m.file << " (iteration " << m.state.iteration << ") on " << deck.eval.shard
              << ": " << N << " samples of " << S << " tokens, " << static_cast<std::int64_t>(l.mlm_count)
              << " labelled positions\n";
    const bool with_sop = cfg.bert && cfg.binary_head;
    std::cout << std::setprecision(8) << "eval loss: " << mlm + (with_sop ? sop : 0.0) << "\n";
    std::cout << "eval lm loss: " << mlm << std::endl;
    if (with_sop) std::cout << "eval sop loss: " << sop << std::endl;
  }
  return 0;
}

int run_eval_only(const Deck& deck, const Topology& topo) {
  const Communicator& world = topo.world();
  std::unique_ptr<TokenShardReader> shard;
  collectively(world.get(), [&] { shard = std::make_unique<TokenShardReader>(deck.eval.shard); });
  const std::int64_t S = deck.model.seq_length, N = deck.eval.windows, B = deck.train.micro_batch_size;
  const std::int64_t vocab = deck.model.vocab_size > 0 ? deck.model.vocab_size : shard->meta().vocab_size;
  TRIDENT_REQUIRE(N * S + 1 <= shard->meta().num_tokens,
                  "eval.windows = " << N << " windows of " << S + 1 << " tokens need " << N * S + 1 << " tokens, but '"
                                    << deck.eval.shard << "' has " << shard->meta().num_tokens);
  EvalModel m(deck, topo, vocab, Family::Gpt);
  Batch batch(B, S, Family::Gpt);
  double loss_sum = 0;
  const Communicator& dpg = topo.dp_group();
  auto block_count = [&](std::int64_t i) {
    const std::int64_t first = (dpg.rank() + i * dpg.size()) * B;
    return std::min(B, N - first);
  };
  loss_sum = m.runner->evaluate(
      m.blocks(N),
      [&](std::int64_t i, MicroBatch& mb) {
        const std::int64_t first = (dpg.rank() + i * dpg.size()) * B, count = block_count(i);
        for (std::int64_t j = 0; j < B; ++j) {
          const std::int64_t k = first + std::min(j, count - 1);  // pad a short last block with its last window
          shard->read(k * S, S + 1, batch.window.data() + j * (S + 1));
        }
        batch.finish(vocab, mb);
      },
      block_count);
  loss_sum = dpg.allreduce_sum(topo.pp_group().allreduce_sum(loss_sum));
  const double loss = loss_sum / static_cast<double>(N * S);
  if (world.rank() == 0) {
    std::cout << "evaluated checkpoint " << m.file << " (iteration " << m.state.iteration << ") on " << deck.eval.shard
              << ": " << N << " windows of " << S << " tokens\n";
    std::cout << std::setprecision(8) << "eval loss: " << loss << "\n";
    std::cout << "eval perplexity: " << std::exp(loss) << std::endl;
  }
  return 0;
}

}  // namespace

namespace {

// The pretraining loop of the model families (BERT and T5: their samples, models and losses).
int run_pretraining(const Deck& deck, Family fam) {
  const bool bert = fam == Family::Bert, t5 = fam == Family::T5;
  Topology topo(MPI_COMM_WORLD, static_cast<int>(deck.parallel.tp), static_cast<int>(deck.parallel.pp));
  const Communicator& world = topo.world();
  const bool root = world.rank() == 0;
  const char* family = family_name(fam);
  if (deck.eval.only) return fam == Family::Gpt ? run_eval_only(deck, topo) : run_masked_eval_only(deck, topo, fam);
  // SIGUSR1 / SIGTERM (time limit, preemption): checkpoint at the next iteration boundary, exit 3
  StopSignal stop;
  topo.print(std::cout);
  gemm_set_tf32(deck.precision.tf32);

  const int dp = topo.dp_size(), dp_rank = topo.coords().dp;
  const std::int64_t S = deck.model.seq_length, mbs = deck.train.micro_batch_size, GB = deck.train.global_batch_size;
  TRIDENT_REQUIRE(GB % (mbs * dp) == 0, "deck: train.global_batch_size (" << GB << ") is not divisible by "
                                                                          << "train.micro_batch_size x data-parallel size ("
                                                                          << mbs << " x " << dp << ")");
  const std::int64_t acc = GB / (mbs * dp);
  TRIDENT_REQUIRE(deck.parallel.vp == 1 || acc % topo.pp_size() == 0,
                  "the interleaved pipeline schedule needs the micro-batches per iteration (" << acc
                      << " = train.global_batch_size / (train.micro_batch_size x dp)) to be divisible by parallel.pp ("
                      << topo.pp_size() << ")");
  const std::int64_t iters = deck.train.iters;

  // ---- data ----
  SampleSource data;
  std::shared_ptr<void> data_owner;
  const std::int64_t valid_samples = deck.eval.interval > 0 ? deck.eval.iters * mbs * dp : 0;
  collectively(world.get(), [&] {
    const std::int64_t n = std::max<std::int64_t>(iters, 1) * GB;
    data = samples_of(fam, deck, n, valid_samples, data_owner);
    TRIDENT_REQUIRE(deck.eval.interval == 0 || data.valid,
                    "eval.interval > 0 but data.split '" << deck.data.split << "' leaves no validation documents");
  });
  std::int64_t vocab = data.vocab;
  if (deck.model.vocab_size > 0)
    TRIDENT_REQUIRE(deck.model.vocab_size == vocab, "the shards have vocab_size " << vocab << " but model.vocab_size is "
                                                                                  << deck.model.vocab_size);

  // ---- model and optimizer ----
  ParamStore store;
  const GptConfig cfg = make_config(deck, vocab, topo.tp_size(), fam);
  const TensorParallel tp = tensor_parallel(deck, topo);
  const std::vector<GptStage> stages = chunks_of(deck, topo, cfg);
  if (t5 && topo.pp_size() > 1) topo.set_decoder_stage(decoder_stage(deck, topo, cfg));
  store.set_dtype(cfg.dt);
  auto chunks = build_chunks(cfg, store, mbs, tp, stages);
  GptModel& model = *chunks.front();
  // Flat buffers padded to equal data-parallel shards of a multiple of 4096 elements (the
  // optimizer kernel's chunk), in both optimizer modes so that they update alike.
  store.allocate(static_cast<std::int64_t>(dp) * 4096);
  store.initialize(static_cast<std::uint64_t>(deck.train.seed));
  const bool zero = deck.optim.distributed;
  const std::int64_t shard = store.padded_size() / dp, shard_begin = shard * dp_rank;
  AdamWConfig ac;
  ac.beta1 = deck.optim.beta1;
  ac.beta2 = deck.optim.beta2;
  ac.eps = deck.optim.eps;
  ac.weight_decay = deck.optim.weight_decay;
  // ZeRO-1: this DP rank's optimizer updates (and keeps moments for) its shard only.
  AdamW adamw(ac, zero ? shard : store.padded_size(), store.decay_size(), zero ? shard_begin : 0);
  // Mixed precision: fp32 master weights of the optimizer's range, from the 16-bit model
  // (Megatron's Float16Optimizer); replaced by the checkpoint's masters on resume.
  const bool half = cfg.dt != DType::F32, fp16 = cfg.dt == DType::F16;
  if (half) adamw.init_master(cfg.dt, store.values16());
  LossScalerConfig lsc;
  lsc.dynamic = fp16 && deck.precision.loss_scale == 0;
  lsc.initial = fp16 ? (deck.precision.loss_scale > 0 ? deck.precision.loss_scale : deck.precision.initial_loss_scale) : 1.0;
  lsc.min_scale = std::min(deck.precision.min_loss_scale, lsc.initial);
  lsc.window = deck.precision.loss_scale_window;
  lsc.hysteresis = deck.precision.hysteresis;
  LossScaler scaler(lsc);
  const auto iterations_of = [](const std::string& key, const std::string& list) {
    std::vector<std::int64_t> its;
    for (const std::string& f : split_list(list)) {
      std::size_t used = 0;
      std::int64_t v = -1;
      try {
        v = std::stoll(f, &used);
      } catch (...) {
      }
      if (used != f.size() || v < 1) throw Error::all("deck: " + key + ": '" + f + "' is not an iteration number");
      its.push_back(v);
    }
    return its;
  };
  const std::vector<std::int64_t> force_overflow = iterations_of("debug.force_overflow", deck.debug.force_overflow);
  const std::vector<std::int64_t> dump_params_at = iterations_of("debug.dump_params_iters", deck.debug.dump_params_iters);
  LrSchedule sched;
  sched.lr = deck.optim.lr;
  sched.min_lr = deck.optim.min_lr;
  sched.warmup_iters = deck.optim.warmup_iters;
  sched.decay_iters = deck.optim.decay_iters;
  sched.style = deck.optim.decay_style;

  std::int64_t iteration = 0, consumed = 0;
  // checkpoint.load = auto: continue from checkpoint.save when an earlier job left one there
  std::string load = auto_checkpoint(deck.checkpoint.load, deck.checkpoint.save, world);
  if (root && deck.checkpoint.load == "auto" && load.empty() && !deck.checkpoint.save.empty())
    std::cout << "checkpoint.load auto: no checkpoint in '" << deck.checkpoint.save << "' yet, starting from scratch\n";
  if (deck.checkpoint.finetune) {  // weights only, unless this fine-tuning run saved checkpoints already
    const std::string own = auto_checkpoint("auto", deck.checkpoint.save, world);
    if (own.empty()) {
      const std::string file = resolve_checkpoint(deck.checkpoint.load);
      check_same_model(file, family, fam, cfg, vocab, topo);
      const CheckpointState st = load_checkpoint(file, family, store, nullptr, topo);
      if (half) adamw.init_master(cfg.dt, store.values16());  // fp32 masters from the loaded weights
      if (root)
        std::cout << "fine-tuning from " << file << " (" << st.model << ", iteration " << st.iteration
                  << "): weights only; iteration, optimizer state and learning-rate schedule start afresh\n";
      load.clear();
    } else {
      load = own;
      if (root) std::cout << "checkpoint.finetune: '" << own << "' holds this run's checkpoints, resuming them\n";
    }
  }
  const bool resuming = !load.empty();
  if (resuming) {
    // checkpoint.load = auto resuming this run's own checkpoints: a checkpoint that fails to load
    // (corrupt: a checksum, an unreadable tensor; or written by a diverged run) gives way to the
    // next older one that loads, with a message; an explicit checkpoint.load never falls back
    const bool may_fall_back = deck.checkpoint.load == "auto" && !deck.checkpoint.finetune;
    std::vector<std::string> candidates;
    std::int64_t newest = std::numeric_limits<std::int64_t>::max();
    try {
      candidates.push_back(resolve_checkpoint(load));
      newest = checkpoint_iteration_of(candidates[0]);
    } catch (const Error& e) {  // `latest` unreadable or naming a missing checkpoint
      if (!may_fall_back) throw;
      if (root) std::cout << "warning: " << e.what() << "\ncheckpoint.load auto: trying the iter_* directories\n";
    }
    if (may_fall_back) {
      std::vector<std::string> older;
      if (root)
        for (const auto& f : checkpoints_newest_first(load))
          if (checkpoint_iteration_of(f) < newest) older.push_back(f);
      for (auto& f : broadcast_list(older, world.get())) candidates.push_back(std::move(f));
      TRIDENT_REQUIRE(!candidates.empty(), "checkpoint.load auto: '" << load << "' holds no checkpoint that loads");
    }
    std::string file;
    CheckpointState st;
    for (std::size_t c = 0;; ++c) {
      file = candidates[c];
      std::string diff;
      try {
        diff = model_differences(file, family, fam, cfg, vocab, topo);
        if (diff.empty()) {
          st = load_checkpoint(file, family, store, &adamw, topo);
          break;
        }
      } catch (const Error& e) {
        if (!may_fall_back || e.scope() != Error::Scope::all_ranks) throw;
        if (c + 1 == candidates.size())
          throw Error::all(std::string(e.what()) + "\n(checkpoint.load auto: no checkpoint in '" + load +
                           "' loads; tried " + std::to_string(candidates.size()) + ")");
        if (root)
          std::cout << "warning: " << e.what() << "\ncheckpoint.load auto: falling back to " << candidates[c + 1]
                    << std::endl;
        continue;
      }
      TRIDENT_REQUIRE(diff.empty(), diff);  // another model: never a reason to fall back
    }
    iteration = st.iteration;
    consumed = st.consumed_samples;
    if (iteration >= iters) {  // a finished run (a job resubmitted once too often, say): nothing to do
      if (root)
        std::cout << "checkpoint " << file << " is at iteration " << iteration << " and train.iters is " << iters
                  << ": nothing left to train (raise train.iters to continue)" << std::endl;
      return 0;
    }
    if (fp16 && st.dtype == "fp16" && lsc.dynamic)
      scaler.restore(st.loss_scale, st.loss_scale_growth_tracker, st.loss_scale_hysteresis_tracker, st.skipped_iterations);
    if (root) {
      std::cout << "resumed from " << file << " at iteration " << iteration << " (" << consumed << " samples consumed)\n";
      if (st.seed != deck.train.seed)
        std::cout << "warning: train.seed " << deck.train.seed << " differs from the checkpoint's " << st.seed
                  << ": the data order changes\n";
    }
  }
  // weights, both moments and (16-bit runs) the fp32 masters, as fp32 tensors
  const std::int64_t checkpoint_bytes =
      store.global_count() * static_cast<std::int64_t>(sizeof(float)) * (adamw.has_master() ? 4 : 3);
  {
    // everything this run will write, checked before its first iteration (collective)
    OutputPlan plan;
    plan.resuming = resuming;
    plan.checkpoint_bytes = checkpoint_bytes;
    check_outputs(deck, plan, world);
  }
  const std::string deck_text = deck.to_ini();
  Watchdog watchdog(deck.watchdog, world.rank());
  std::int64_t last_saved = -1;
  auto save = [&](std::int64_t it) {
    watchdog.slow_phase("checkpoint save", it);
    last_saved = it;
    CheckpointState st;
    st.model = family;
    st.iteration = it;
    st.consumed_samples = consumed;
    st.optimizer_steps = adamw.steps();
    st.seed = deck.train.seed;
    st.loss_scale = scaler.scale();
    st.loss_scale_growth_tracker = scaler.growth_tracker();
    st.loss_scale_hysteresis_tracker = scaler.hysteresis_tracker();
    st.skipped_iterations = scaler.skipped();
    st.dtype = deck.precision.dtype;
    st.deck = deck_text;
    check_room_for_checkpoint(deck.checkpoint.save, checkpoint_bytes, world);
    const std::string f = save_checkpoint(deck.checkpoint.save, st, store, &adamw, topo);
    if (root) std::cout << "saved checkpoint " << f << std::endl;
  };

  // tokens of an iteration (T5: encoder and decoder tokens)
  const double tokens_per_iter = static_cast<double>(GB * (S + (t5 ? cfg.decoder_seq_length : 0)));
  const double flops_per_iter = model.flops_per_step(GB * S);
  if (root) {
    std::cout << (bert ? "BERT: " : t5 ? "T5: " : "GPT: ") << cfg.num_layers
              << (t5 ? " encoder + " + std::to_string(cfg.decoder_layers) + " decoder" : std::string()) << " layers, hidden " << cfg.hidden << ", heads " << cfg.heads << ", ffn "
              << cfg.ffn << ", seq " << S
              << (t5 ? " (encoder), " + std::to_string(cfg.decoder_seq_length) + " (decoder)" : std::string()) << ", vocab " << vocab << " (padded " << cfg.padded_vocab << "), "
              << store.global_count() << " parameters\n"
              << "parallel: tp " << topo.tp_size() << (tp.sequence_parallel ? " with sequence parallelism" : "")
              << ", pp " << topo.pp_size()
              << (topo.pp_size() == 1 ? "" : deck.parallel.vp > 1 ? " (interleaved 1F1B, vp " + std::to_string(deck.parallel.vp) + ")" : " (1F1B)")
              << ", dp " << dp << "; dropout hidden " << cfg.hidden_dropout << ", attention " << cfg.attention_dropout << "\n"
              << (topo.pp_size() > 1 ? "stage 0 holds layers " + [&] {
                   std::string r;
                   for (const auto& st : stages)
                     r += (r.empty() ? "" : ", ") + std::to_string(st.first_layer) + ".." +
                          std::to_string(st.first_layer + st.num_layers - 1);
                   return r;
                 }() + "\n" : std::string())
              << "batch: global " << GB << " = micro " << mbs << " x accumulation " << acc << " x dp " << dp
              << "; iterations " << iters << "; GEMM: " << gemm_backend_name() << "\n"
              << "optimizer: AdamW"
              << (zero ? ", distributed (ZeRO-1): each of the " + std::to_string(dp) + " data-parallel ranks keeps " +
                             std::to_string(shard) + " of " + std::to_string(store.padded_size()) + " elements' state"
                       : std::string())
              << "; precision: " << deck.precision.dtype
              << (half ? " (16-bit parameters and GEMM inputs, fp32 master weights, gradients, residual stream, "
                         "softmax and cross-entropy)" : "")
              << (fp16 ? (lsc.dynamic ? "; dynamic loss scaling from " : "; constant loss scale ") +
                             std::to_string(lsc.initial)
                       : std::string())
              << "; recomputation: " << deck.precision.recompute
              << (deck.precision.recompute == "full" ? " (" + deck.precision.recompute_method + ", " +
                                                           std::to_string(deck.precision.recompute_num_layers) + " layers)"
                                                     : std::string())
              << "\n"
              << "data: " << deck.data.train_shards << "\n"
              << data.description
              << "model FLOPs per iteration: " << flops_per_iter
              << (t5 ? " (GEMM FLOPs of encoder, decoder with cross-attention and LM head, no recomputation)\n"
                     : " (Megatron, no recomputation: 72 B s l h^2 (1 + s/6h + V/12hl))\n");
    if (deck.perf.peak_tflops > 0)
      std::cout << "MFU against a peak of " << deck.perf.peak_tflops << " TFLOP/s per rank"
                << (deck.perf.peak_name.empty() ? "" : " (" + deck.perf.peak_name + ")") << "\n";
    std::cout << std::flush;
  }

  MetricsWriter metrics, eval_metrics;
  if (root && !deck.log.metrics_file.empty()) {
    std::vector<std::string> columns = {"iteration", "consumed_samples", "loss", "lr", "grad_norm", "loss_scale",
                                        "skipped", "ms_per_iter", "tokens_per_s", "tflops_per_rank", "mfu"};
    if (bert) columns.insert(columns.begin() + 3, {"lm_loss", "sop_loss"});
    metrics = MetricsWriter(deck.log.metrics_file, columns, resuming ? iteration : -1);
    if (deck.eval.interval > 0)
      eval_metrics = MetricsWriter(sibling_metrics_path(deck.log.metrics_file, "eval"),
                                   bert ? std::vector<std::string>{"iteration", "loss", "lm_loss", "sop_loss"}
                                        : std::vector<std::string>{"iteration", "loss", "ppl"},
                                   resuming ? iteration : -1);
  }
  std::unique_ptr<BatchDumper> dumper;
  if (root && !deck.debug.dump_batches.empty()) dumper = std::make_unique<BatchDumper>(deck.debug.dump_batches, resuming);

  std::int64_t tape_iteration = 0;  // the iteration the dropout tape's masks belong to
  std::unique_ptr<DropoutTape> tape;
  if (!deck.debug.dump_dropout.empty()) {
    // the tape is a sequence of forward calls: one rank, each forward pass run once
    TRIDENT_REQUIRE(world.size() == 1 && deck.precision.recompute == "none",
                    "debug.dump_dropout records the masks of a one-rank run without recomputation (this run has "
                        << world.size() << " ranks, recomputation " << deck.precision.recompute << ")");
    tape = std::make_unique<DropoutTape>(deck.debug.dump_dropout, &tape_iteration);
  }

  if (!deck.checkpoint.save.empty() && deck.checkpoint.save_initial && iteration == 0) save(0);

  std::int64_t consecutive_skips = 0;  // fp16: overflowing iterations in a row
  Batch batch(mbs, S, fam, deck.model.decoder_seq_length);
  // GPT: the loss is the mean over the iteration's tokens; BERT: the mean over its micro-batches
  // of each micro-batch's MLM (mean over its labelled positions) + sentence-order loss; T5: the
  // mean over its micro-batches of each one's mean over its decoder targets (Megatron's T5)
  const double loss_count = bert || t5 ? static_cast<double>(acc * dp) : static_cast<double>(GB * S);
  const double dscale_unscaled = 1.0 / loss_count;
  // BERT's two losses of the iteration, summed over the model chunks and ranks
  auto bert_parts = [&]() {
    return reduce_bert_losses(chunks, topo);
  };
  const FloatView grads = store.grads();
  PhaseTimers timers;

  PipelineRunner runner(raw(chunks), topo);
  runner.grouped_p2p = deck.debug.grouped_p2p;
  runner.record = !deck.log.timeline_file.empty();
  // Overlapped, bucketed data-parallel reduction (one bucket per layer, started by the backward
  // pass of the iteration's last micro-batch).
  const bool overlap = deck.parallel.overlap_grad_reduce && dp > 1;
  GradReducer reducer(store, topo.dp_group(), zero ? shard : 0);
  if (overlap)
    for (auto& chunk : chunks) chunk->on_layer_grads_ready = [&](std::int64_t l) { reducer.layer_ready(l); };
  // micro-batch k of the current iteration, read on a helper thread while k - 1 computes
  Prefetcher prefetch(
      [&](std::int64_t k, std::vector<std::int32_t>& w) {
        const std::int64_t first = consumed + (k * dp + dp_rank) * mbs;
        for (std::int64_t j = 0; j < mbs; ++j) data.train(first + j, w.data() + j * batch.width);
      },
      static_cast<std::size_t>(mbs * batch.width), deck.data.prefetch);
  auto evaluate = [&](std::int64_t it) {
    double sum = runner.evaluate(
        deck.eval.iters,
        [&](std::int64_t k, MicroBatch& mb) {
          for (std::int64_t j = 0; j < mbs; ++j)
            data.valid((k * dp + dp_rank) * mbs + j, batch.window.data() + j * batch.width);
          batch.finish(vocab, mb);
        },
        [&](std::int64_t) { return mbs; });
    sum = topo.dp_group().allreduce_sum(topo.pp_group().allreduce_sum(sum));
    const double n = bert || t5 ? static_cast<double>(deck.eval.iters * dp)
                                : static_cast<double>(deck.eval.iters * mbs * dp * S);
    const double loss = sum / n;
    const BertLosses parts = bert || t5 ? bert_parts() : BertLosses{};
    if (root) {
      std::cout << std::setprecision(6) << " validation at iteration " << it << " | loss " << loss;
      if (bert)
        std::cout << " | lm loss " << parts.mlm / n << " | sop loss " << parts.sop / n << std::endl;
      else
        std::cout << " | ppl " << std::exp(loss) << std::endl;
      eval_metrics.write(bert ? std::vector<double>{static_cast<double>(it), loss, parts.mlm / n, parts.sop / n}
                              : std::vector<double>{static_cast<double>(it), loss, std::exp(loss)});
    }
  };

  topo.tp_group().reset_stats();
  topo.dp_group().reset_stats();
  double bubble_sum = 0;
  const std::int64_t first_iteration = iteration;
  const double t_start = wall_seconds();
  double t_last = t_start;
  std::int64_t iters_since_log = 0;
  stop.arm();  // from here a signal checkpoints at the next iteration boundary (before: exit 4 at once)
  while (iteration < iters) {
    const std::int64_t it = iteration + 1;
    tape_iteration = it;
    const double t0 = wall_seconds();
    watchdog.iteration(it);
    store.zero_grads();
    timers.start("forward-backward");
    progress::set_phase("forward-backward");
    const double pipe_t0 = wall_seconds(), busy0 = runner.forward_seconds() + runner.backward_seconds();
    // fp16: the loss gradient is multiplied by the loss scale (1 otherwise)
    const float dscale = static_cast<float>(dscale_unscaled * scaler.scale());
    const double scale_used = scaler.scale();
    double loss_sum = runner.train(
        acc,
        [&](std::int64_t k, MicroBatch& mb) {
          const std::vector<std::int32_t>& w = prefetch.get(k, acc);
          std::copy(w.begin(), w.end(), batch.window.begin());
          batch.finish(vocab, mb);
        },
        dscale,
        [&](std::int64_t k) {
          // Dropout streams keyed by the global micro-batch index: independent of dp and of the
          // accumulation split, and exactly reproduced on resume.
          DropoutStreams rng;
          rng.training = true;
          rng.step = static_cast<std::uint64_t>((consumed + (k * dp + dp_rank) * mbs) / mbs);
          rng.shared = static_cast<std::uint64_t>(deck.train.seed);
          rng.tp_local = static_cast<std::uint64_t>(deck.train.seed) + 2718 + static_cast<std::uint64_t>(topo.coords().tp);
          return rng;
        });
    prefetch.drain();
    // the shards this iteration read must still be the files opened (a shard truncated or replaced
    // under the job reads as zeros or as another corpus): checked before the step uses the data
    progress::set_phase("shard check");
    agree_or_throw(world.get(), TokenShardReader::check_touched_shards());
    // bubble as Megatron defines it: idle time over busy (forward + backward) time of a stage
    const double span = wall_seconds() - pipe_t0;
    const double busy = runner.forward_seconds() + runner.backward_seconds() - busy0;
    if (iteration > first_iteration)  // the first iteration also allocates activation slots
      bubble_sum += busy > 0 ? (span - busy) / busy : 0.0;
    timers.stop("forward-backward");
    timers.start("grad-allreduce");
    progress::set_phase("grad-allreduce");
    if (overlap) reducer.wait();  // the layers' buckets, started during the backward pass
    if (tp.sequence_parallel)  // replicated parameters saw only this rank's rows
      tp_allreduce(tp, slice(grads, store.replicated_begin(), store.replicated_end() - store.replicated_begin()),
                   store.replicated_end() - store.replicated_begin());
    for (auto& chunk : chunks) {  // tied embeddings: the stages that hold them sum their gradients
      if (topo.pp_size() > 1 && chunk->word_embeddings() >= 0) {
        const FloatView g = store.grad(chunk->word_embeddings());
        topo.embedding_group().allreduce_sum(g.data(), static_cast<std::int64_t>(g.extent(0)));
      }
      if (t5 && topo.pp_size() > 1 && chunk->position_embeddings() >= 0) {  // T5: first and decoder stage
        const FloatView g = store.grad(chunk->position_embeddings());
        topo.position_group().allreduce_sum(g.data(), static_cast<std::int64_t>(g.extent(0)));
      }
    }
    if (overlap)
      reducer.reduce_rest();  // what no layer bucket covered (to the shards' owners with ZeRO-1)
    else if (zero)  // each DP rank receives the sum of its shard only
      topo.dp_group().reduce_scatter_in_place(grads.data(), shard);
    else
      topo.dp_group().allreduce_sum(grads.data(), store.padded_size());
    loss_sum = topo.dp_group().allreduce_sum(topo.pp_group().allreduce_sum(loss_sum));
    const BertLosses parts = bert || t5 ? bert_parts() : BertLosses{};  // (T5: resets the model's sums)
    timers.stop("grad-allreduce");
    timers.start("optimizer");
    progress::set_phase("optimizer");
    const double loss = loss_sum / loss_count;
    // Loss scaling (fp16): unscale the optimizer's range of the main gradients, check it for
    // inf/NaN, agree on the verdict over every rank, and skip the step on overflow.
    const FloatView opt_grads = slice(grads, adamw.begin(), adamw.size());
    if (std::find(force_overflow.begin(), force_overflow.end(), it) != force_overflow.end() && world.rank() == 0)
      Kokkos::deep_copy(slice(opt_grads, 0, 1), std::numeric_limits<float>::infinity());
    bool skip = false;
    if (fp16) {
      if (scale_used != 1.0) scale(opt_grads, static_cast<float>(1.0 / scale_used), adamw.size());
      const bool found_inf = world.allreduce_max(has_nonfinite(opt_grads, adamw.size()) ? 1.0 : 0.0) > 0;
      // a run that keeps overflowing has diverged: stop it rather than skip forever (and never
      // checkpoint its non-finite state); every rank decides alike from the agreed verdict
      TRIDENT_REQUIRE(!(found_inf && lsc.dynamic && scaler.scale() <= lsc.min_scale),
                      "iteration " << it << ": the fp16 gradients overflow at the minimum loss scale ("
                                   << lsc.min_scale << "): training has diverged (loss " << loss_sum / loss_count
                                   << "); lower optim.lr, or train in bf16");
      skip = scaler.update(found_inf);
      consecutive_skips = skip ? consecutive_skips + 1 : 0;
      TRIDENT_REQUIRE(deck.precision.max_skipped_iterations == 0 || consecutive_skips < deck.precision.max_skipped_iterations,
                      "iteration " << it << ": " << consecutive_skips << " fp16 iterations in a row overflowed and were "
                                   << "skipped (precision.max_skipped_iterations): training has diverged; lower optim.lr, "
                                   << "or train in bf16");
    }
    const double gnorm = skip ? std::nan("") : global_grad_norm(store, topo, shard_begin, shard_begin + shard);
    TRIDENT_REQUIRE(skip || (std::isfinite(loss) && std::isfinite(gnorm)),
                    "iteration " << it << ": the loss or gradient is not finite (loss " << loss << ", grad norm "
                                 << gnorm << "); lower optim.lr or check the data");
    if (it == 1 && !deck.debug.dump_grads.empty()) {
      if (zero) topo.dp_group().allgather_in_place(grads.data(), shard);  // debug only: every shard
      save_named_tensors(deck.debug.dump_grads, "", store, grads, it, topo);
    }
    if (tape) tape->flush();
    if (dumper) {
      std::vector<std::int32_t> rows(static_cast<size_t>(GB * batch.width));
      for (std::int64_t i = 0; i < GB; ++i) data.train(consumed + i, rows.data() + i * batch.width);
      dumper->write(it, rows, GB, batch.width);
    }
    float clip = 1.f;
    if (deck.optim.clip_grad > 0) {
      const double c = deck.optim.clip_grad / (gnorm + 1e-6);
      if (c < 1.0) clip = static_cast<float>(c);
    }
    const double lr = sched.at(it);
    if (skip) {
      // overflow: no update (Megatron's skipped iteration); the schedule still advances
    } else if (half) {
      adamw.step_mixed(store.values16(), grads, lr, clip);
      if (zero) topo.dp_group().allgather_in_place(store.values16().data(), shard);  // 16-bit shards to every rank
    } else {
      adamw.step(store.values(), grads, lr, clip);
      if (zero) topo.dp_group().allgather_in_place(store.values().data(), shard);  // updated shards to every rank
    }
    timers.stop("optimizer");
    if (!deck.debug.dump_params.empty() && std::find(dump_params_at.begin(), dump_params_at.end(), it) != dump_params_at.end()) {
      // the updated parameters (16-bit runs: the 16-bit model widened, as in a checkpoint)
      std::ostringstream name;
      name << "iter_" << std::setw(7) << std::setfill('0') << it << ".h5";
      const FloatView values = half ? Kokkos::create_mirror_view_and_copy(FloatView::memory_space(), store.model_to_host())
                                    : store.values();
      save_named_tensors((std::filesystem::path(deck.debug.dump_params) / name.str()).string(), "", store, values, it, topo);
    }
    consumed += GB;
    iteration = it;
    ++iters_since_log;

    const double t1 = wall_seconds();
    const double dt = t1 - t0;
    watchdog.iteration_done(dt);
    const double tps = tokens_per_iter / dt;
    const double tflops = flops_per_iter / dt / world.size() / 1e12;
    const double mfu = deck.perf.peak_tflops > 0 ? tflops / deck.perf.peak_tflops : std::nan("");
    if (root) {
      std::vector<double> row = {static_cast<double>(it), static_cast<double>(consumed), loss, lr, gnorm, scale_used,
                                 skip ? 1.0 : 0.0, dt * 1e3, tps, tflops, mfu};
      if (bert) row.insert(row.begin() + 3, {parts.mlm / loss_count, parts.sop / loss_count});
      metrics.write(row);
      if (it % deck.log.interval == 0 || it == iters) {
        const double per_iter = (t1 - t_last) / static_cast<double>(iters_since_log);
        std::ostringstream os;
        os << " iter " << std::setw(6) << it << "/" << iters << " | loss " << std::fixed << std::setprecision(4) << loss;
        if (bert)
          os << " | lm loss " << parts.mlm / loss_count << " | sop loss " << parts.sop / loss_count;
        os << " | lr " << std::scientific << std::setprecision(3) << lr << std::fixed << " | gnorm "
           << std::setprecision(3) << gnorm << " | " << std::setprecision(1) << per_iter * 1e3 << " ms/it | "
           << std::setprecision(0) << tokens_per_iter / per_iter << " tok/s | " << std::setprecision(3)
           << flops_per_iter / per_iter / world.size() / 1e12 << " TFLOP/s/rank";
        if (deck.perf.peak_tflops > 0) os << " | MFU " << std::setprecision(1) << 100.0 * mfu << "%";
        if (fp16)
          os << " | loss scale " << std::defaultfloat << std::setprecision(6) << scale_used << std::fixed
             << " | skipped " << scaler.skipped();
        os << " | ETA " << hms(per_iter * static_cast<double>(iters - it));
        std::cout << os.str() << std::endl;
        t_last = t1;
        iters_since_log = 0;
      }
    }
    if (deck.eval.interval > 0 && (it % deck.eval.interval == 0 || it == iters)) {
      watchdog.slow_phase("evaluation", it);
      evaluate(it);
    }
    if (!deck.checkpoint.save.empty() && ((deck.checkpoint.interval > 0 && it % deck.checkpoint.interval == 0) || it == iters))
      save(it);
    if (const int sig = stop.agreed(world); sig != 0 && it < iters) {  // time limit or preemption
      if (deck.checkpoint.save.empty()) {
        if (root)
          std::cout << "received " << StopSignal::name(sig) << ": stopping after iteration " << it
                    << " without a checkpoint (checkpoint.save is not set); exit code " << kExitStoppedNoCheckpoint
                    << std::endl;
        return kExitStoppedNoCheckpoint;
      }
      if (last_saved != it) save(it);
      if (root)
        std::cout << "received " << StopSignal::name(sig) << ": stopped after iteration " << it << " of " << iters
                  << " with a checkpoint in '" << deck.checkpoint.save << "'; exit code " << kExitCheckpointed
                  << " (resubmit with --checkpoint.load auto to continue)" << std::endl;
      return kExitCheckpointed;
    }
  }
  watchdog.idle();
  const double trained = static_cast<double>(std::max<std::int64_t>(iteration - first_iteration - 1, 1));
  const double bubble = topo.world().allreduce_sum(bubble_sum / trained) / topo.world_size();
  // Per-rank timers, gathered to rank 0: forward, backward, p2p wait, gradient reduction, optimizer.
  std::vector<double> mine = {runner.forward_seconds(), runner.backward_seconds(), runner.p2p_seconds(),
                              timers.totals().count("grad-allreduce") ? timers.totals().at("grad-allreduce") : 0.0,
                              timers.totals().count("optimizer") ? timers.totals().at("optimizer") : 0.0};
  std::vector<double> all(root ? 5 * static_cast<size_t>(topo.world_size()) : 0);
  MPI_Gather(mine.data(), 5, MPI_DOUBLE, all.data(), 5, MPI_DOUBLE, 0, world.get());
  if (root && topo.world_size() > 1) {
    std::ostringstream os;
    os << "timers per rank (s): rank | pp tp dp | forward | backward | p2p wait | grad reduction | optimizer\n";
    for (int r = 0; r < topo.world_size(); ++r) {
      const RankCoords c = Topology::coords_of(r, topo.tp_size(), topo.dp_size(), topo.pp_size());
      os << "  " << std::setw(4) << r << " | " << c.pp << " " << c.tp << " " << c.dp << std::fixed << std::setprecision(3);
      for (int k = 0; k < 5; ++k) os << " | " << std::setw(8) << all[5 * r + k];
      os << "\n";
    }
    std::cout << os.str() << std::flush;
  }
  // ---- memory accounting, per rank, beside Megatron's and Korthikanti et al.'s figures ----
  {
    MemoryFigures mf;
    mf.params = static_cast<double>(store.model_bytes());
    mf.grads = 4.0 * static_cast<double>(store.padded_size());
    mf.optimizer = static_cast<double>(adamw.state_bytes());
    mf.local_params = static_cast<double>(store.size());
    for (auto& chunk : chunks) {
      mf.activations += static_cast<double>(chunk->num_slots()) * static_cast<double>(chunk->activation_bytes_per_slot());
      mf.workspace += static_cast<double>(chunk->workspace_bytes());
      mf.slots = std::max(mf.slots, static_cast<double>(chunk->num_slots()));
    }
    mf.layer_activations = model.layer_activation_bytes();
    ActivationModel am;
    am.s = static_cast<double>(S);
    am.b = static_cast<double>(mbs);
    am.h = static_cast<double>(cfg.hidden);
    am.a = static_cast<double>(cfg.heads);
    am.t = static_cast<double>(topo.tp_size());
    am.sp = tp.sequence_parallel;
    am.e = static_cast<double>(dtype_bytes(cfg.dt));  // bytes of a stored activation value
    am.recompute = deck.precision.recompute;
    am.flash = deck.model.flash_attention;
    am.block = deck.precision.recompute_method == "block";
    am.group = static_cast<double>(deck.precision.recompute_num_layers);
    am.layers = static_cast<double>(model.num_layers());
    // (T5: encoder and decoder layers differ in shape; the formula is for one kind of layer)
    const double formula = !t5 && model.num_layers() > 0 ? korthikanti_layer_bytes(am) : 0.0;
    const double bpp = (mf.params + mf.grads + mf.optimizer) / std::max(mf.local_params, 1.0);
    const double mega = megatron_bytes_per_param(deck.precision.dtype, zero, dp);
    std::vector<double> mine_mem = {mf.params, mf.grads, mf.optimizer, bpp, mega, mf.activations, mf.slots,
                                    mf.workspace, mf.layer_activations, formula};
    const int K = static_cast<int>(mine_mem.size());
    std::vector<double> all_mem(root ? static_cast<size_t>(K) * static_cast<size_t>(topo.world_size()) : 0);
    MPI_Gather(mine_mem.data(), K, MPI_DOUBLE, all_mem.data(), K, MPI_DOUBLE, 0, world.get());
    if (root) {
      std::ostringstream os;
      os << "memory per rank (MiB, measured from the allocated buffers; bytes per parameter beside Megatron's "
         << deck.precision.dtype << (zero ? " distributed-optimizer" : "") << " figure; activations per layer and "
         << "micro-batch beside Korthikanti et al. 2022 with " << am.e << "-byte values and 1-byte masks):\n"
         << "  rank | pp tp dp |   params |    grads | optimizer | bytes/param (Megatron) | activations (micro-batches) "
            "| workspace | per layer: measured KiB / formula KiB (ratio)\n";
      const double MiB = 1024.0 * 1024.0;
      for (int r = 0; r < topo.world_size(); ++r) {
        const double* v = &all_mem[static_cast<size_t>(r) * K];
        const RankCoords c = Topology::coords_of(r, topo.tp_size(), topo.dp_size(), topo.pp_size());
        os << "  " << std::setw(4) << r << " | " << c.pp << "  " << c.tp << "  " << c.dp << " | " << std::fixed
           << std::setprecision(2) << std::setw(8) << v[0] / MiB << " | " << std::setw(8) << v[1] / MiB << " | "
           << std::setw(9) << v[2] / MiB << " | " << std::setw(8) << v[3] << " (" << std::setprecision(2) << v[4]
           << ") | " << std::setw(10) << v[5] / MiB << " (" << std::setprecision(0) << v[6] << ") | "
           << std::setprecision(2) << std::setw(9) << v[7] / MiB << " | " << std::setprecision(1) << v[8] / 1024.0
           << " / " << v[9] / 1024.0 << " (" << std::setprecision(3) << (v[9] > 0 ? v[8] / v[9] : 0.0) << ")\n";
      }
      os << "memory figures:";
      for (int k = 0; k < K; ++k) os << " " << std::setprecision(6) << std::defaultfloat << all_mem[k];
      std::cout << os.str() << std::endl;
    }
  }
  if (!deck.log.timeline_file.empty()) write_timeline(deck.log.timeline_file, runner.events(), topo, t_start);
  if (root && topo.pp_size() > 1) {
    std::cout << std::fixed << std::setprecision(3) << "pipeline bubble: measured " << bubble
              << " (idle over busy time of the forward-backward phase, mean over ranks and iterations), theory (p-1)/m = "
              << static_cast<double>(topo.pp_size() - 1) / static_cast<double>(acc * deck.parallel.vp)
              << (deck.parallel.vp > 1 ? " (interleaved: (p-1)/(v m))" : "") << " (p " << topo.pp_size()
              << ", v " << deck.parallel.vp << ", m " << acc << "); p2p wait " << runner.p2p_seconds() << " s on rank 0" << std::endl;
    if (!deck.log.timeline_file.empty()) std::cout << "timeline: " << deck.log.timeline_file << std::endl;
  }
  if (root) {
    const double total = wall_seconds() - t_start;
    std::ostringstream os;
    os << "done: " << iteration << " iterations, " << consumed << " samples consumed, " << std::fixed
       << std::setprecision(1) << total << " s. Time per phase (rank 0):";
    for (auto& [name, sec] : timers.totals()) os << " " << name << " " << std::setprecision(2) << sec << " s;";
    const double n = static_cast<double>(std::max<std::int64_t>(iteration - first_iteration, 1));
    os << "\ncommunication per iteration (rank 0, evaluations included):";
    for (const auto* g : {&topo.tp_group(), &topo.dp_group()}) {
      os << (g == &topo.tp_group() ? " tp" : " | dp");
      if (g->all_stats().empty()) os << " none";
      for (auto& [kind, st] : g->all_stats())
        os << " " << kind << " " << std::setprecision(1) << st.calls / n << " calls " << std::setprecision(3)
           << st.bytes / n / 1e6 << " MB;";
    }
    std::cout << os.str() << std::endl;
  }
  return 0;
}

}  // namespace

int run_gpt(const Deck& deck) { return run_pretraining(deck, Family::Gpt); }
int run_bert(const Deck& deck) { return run_pretraining(deck, Family::Bert); }
int run_t5(const Deck& deck) { return run_pretraining(deck, Family::T5); }

}  // namespace trident
