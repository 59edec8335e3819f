// Building the model of a deck (train/model_setup.hpp): configuration, pipeline chunks,
// checkpoint compatibility, and the reductions over the model chunks.
#include "train/model_setup.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "layers/layer_modules.hpp"
#include "ops/elementwise.hpp"
#include "train/pipeline_schedule.hpp"

namespace trident {

namespace {

std::int64_t pad_vocab(std::int64_t v, std::int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

}  // namespace

HeadOptions head_options(const Deck& d) {
  HeadOptions h;
  h.binary_head = d.bert.binary_head;
  return h;
}

TransformerConfig make_config(const Deck& d, std::int64_t vocab, std::int64_t tp, ModelFamily family) {
  // the decoder keys belong to T5 alone (the deck's default position table covers the decoder
  // length, so a stray value would silently enlarge a GPT or BERT model)
  TRIDENT_REQUIRE(family == ModelFamily::T5 || (d.model.decoder_seq_length == 0 && d.model.decoder_num_layers == 0),
                  "deck: model.decoder_seq_length (" << d.model.decoder_seq_length << ") and model.decoder_num_layers ("
                                                     << d.model.decoder_num_layers << ") are T5 keys; a "
                                                     << family_name(family) << " model has no decoder: leave them 0");
  TransformerConfig c;
  set_family_spec(family, c, d.model.decoder_num_layers > 0 ? d.model.decoder_num_layers : d.model.num_layers,
                  d.model.decoder_seq_length);
  static_cast<ModelArch&>(c) = d.model;  // every architecture key, as the deck resolved it
  c.num_layers = d.model.num_layers;
  c.seq_length = d.model.seq_length;
  c.max_positions = d.model.max_position_embeddings;
  c.vocab_size = vocab;
  c.padded_vocab = pad_vocab(vocab, d.model.make_vocab_size_divisible_by * tp);
  c.recompute = d.precision.recompute == "full"        ? TransformerConfig::Recompute::Full
                : d.precision.recompute == "selective" ? TransformerConfig::Recompute::Selective
                                                       : TransformerConfig::Recompute::None;
  c.recompute_block = d.precision.recompute_method == "block";
  c.recompute_num_layers = d.precision.recompute_num_layers;
  c.dt = d.precision.dtype == "bf16" ? DType::BF16 : d.precision.dtype == "fp16" ? DType::F16 : DType::F32;
  TRIDENT_REQUIRE(family == ModelFamily::Gpt || !d.data.packed(),
                  "deck: data.reset_position_ids, data.reset_attention_mask and data.eod_mask_loss pack GPT documents; "
                      << family_name(family) << " samples are not packed: leave them false");
  c.reset_position_ids = d.data.reset_position_ids;
  c.reset_attention_mask = d.data.reset_attention_mask;
  c.per_target_loss = d.data.eod_mask_loss || d.sft.enabled();  // the mean over each micro-batch's counted targets
  check_layer_modules(c);                                       // every slot's module exists
  TRIDENT_REQUIRE(family == ModelFamily::Gpt || !c.untie_embeddings_and_output_weights,
                  "deck: model.untie_embeddings_and_output_weights is a GPT key; " << family_name(family)
                                                                                   << "'s output layer is tied");
  // Grouped-query attention, a head dimension of its own and q/k norms are validated for the
  // decoder-only GPT models; T5's cross-attention and the BERT/T5 references keep multi-head
  // attention over hidden_size / num_heads channels per head.
  TRIDENT_REQUIRE(family == ModelFamily::Gpt ||
                      (c.groups() == c.num_heads && !c.qk_layernorm && c.num_heads * c.head_dim() == c.hidden_size),
                  "deck: model.num_query_groups, model.kv_channels and model.qk_layernorm are GPT keys; "
                      << family_name(family) << " uses multi-head attention (num_query_groups = num_heads = "
                      << c.num_heads << ", kv_channels = hidden_size / num_heads)");
  TRIDENT_REQUIRE(family == ModelFamily::Gpt || !c.moe.on(),
                  "deck: moe.num_experts > 0 is a GPT key (mixture-of-experts decoders); "
                      << family_name(family) << " keeps dense MLPs: leave it 0");
  if (d.lora.rank > 0) {
    c.lora_rank = d.lora.rank;
    c.lora_scale = static_cast<float>((d.lora.alpha > 0 ? d.lora.alpha : static_cast<double>(d.lora.rank)) /
                                      static_cast<double>(d.lora.rank));
    c.lora_targets = lora_targets(d.lora.targets);
    for (const char* t : {"cross_q", "cross_kv", "cross_proj"})
      TRIDENT_REQUIRE(family == ModelFamily::T5 || c.lora_targets.count(t) == 0,
                      "deck: lora.targets: " << t << " is a projection of T5's decoder; a " << family_name(family)
                                             << " model has no cross-attention");
  }
  return c;
}

// A checkpoint continues (or seeds) this run only if it holds the same model: every dimension
// that shapes the weights and every architecture key (strings and floats too: a change of
// normalisation, activation or position encoding with the same shapes would load silently),
// compared from the deck stored in the checkpoint. Tensor shapes alone would let fewer layers
// (the extra ones dropped) or other head counts (same shapes) through. Run-time choices that
// ModelArch also holds (dropout, the fused attention kernel, the initialisation's std) may differ.
// Returns the table of differences, or "" when the checkpoint holds this model (collective; a
// checkpoint whose deck cannot be read throws).
std::string model_differences(const std::string& file, const char* family, ModelFamily fam,
                              const TransformerConfig& want, const HeadOptions& want_head, std::int64_t vocab,
                              const Topology& topo) {
  const Deck saved_deck = parse_stored_deck(read_checkpoint_deck(file, family, topo.world().get()));
  const TransformerConfig got = make_config(saved_deck, vocab, topo.tp_size(), fam);
  const HeadOptions got_head = head_options(saved_deck);
  struct Row {
    std::string key, saved, run;
  };
  const auto num = [](std::int64_t v) { return std::to_string(v); };
  std::vector<Row> rows = {{"model.num_layers", num(got.num_layers), num(want.num_layers)},
                           {"model.max_position_embeddings", num(got.max_positions), num(want.max_positions)}};
  static const std::set<std::string> run_time = {"model.hidden_dropout",  "model.attention_dropout",
                                                 "model.flash_attention", "model.attention_backend",
                                                 "model.init_method_std", "moe.router_bias_update_rate"};
  const auto saved_arch = model_arch_keys(got), run_arch = model_arch_keys(want);
  for (size_t i = 0; i < saved_arch.size(); ++i)
    if (!run_time.count(saved_arch[i].first))
      rows.push_back({saved_arch[i].first, saved_arch[i].second, run_arch[i].second});
  if (fam == ModelFamily::T5)
    rows.push_back({"model.decoder_num_layers", num(got.decoder_layers), num(want.decoder_layers)});
  if (fam == ModelFamily::Bert)
    rows.push_back({"bert.binary_head", num(got_head.binary_head ? 1 : 0), num(want_head.binary_head ? 1 : 0)});
  if (saved_deck.model.vocab_size > 0)
    rows.push_back({"model.vocab_size", num(saved_deck.model.vocab_size), num(want.vocab_size)});
  std::ostringstream table;
  bool differ = false;
  table << "checkpoint " << file << " holds another model than this run's:\n  " << std::left << std::setw(40) << "key"
        << std::right << std::setw(20) << "checkpoint" << std::setw(20) << "this run";
  for (const Row& r : rows) {
    if (r.saved == r.run) continue;
    differ = true;
    table << "\n  " << std::left << std::setw(40) << r.key << std::right << std::setw(20) << r.saved << std::setw(20)
          << r.run;
  }
  return differ ? table.str() : std::string();
}

void check_same_model(const std::string& file, const char* family, ModelFamily fam, const TransformerConfig& want,
                      const HeadOptions& want_head, std::int64_t vocab, const Topology& topo) {
  const std::string diff = model_differences(file, family, fam, want, want_head, vocab, topo);
  TRIDENT_REQUIRE(diff.empty(), diff);
}

Deck with_checkpoint_lora(Deck deck, const std::string& file, const char* family, const Topology& topo) {
  deck.lora = parse_stored_deck(read_checkpoint_deck(file, family, topo.world().get())).lora;
  return deck;
}

CheckpointState load_model_weights(const std::string& file, const char* family, ModelFamily fam,
                                   const TransformerConfig& cfg, const HeadOptions& head, std::int64_t vocab,
                                   ParamStore& store, const Topology& topo) {
  check_same_model(file, family, fam, cfg, head, vocab, topo);
  if (!store.has_adapters()) return load_checkpoint(file, family, store, nullptr, topo);
  const CheckpointState st = load_checkpoint(file, family, store, nullptr, topo, TensorSet::adapters);
  check_same_model(st.lora_base, family, fam, cfg, head, vocab, topo);
  const std::string digest = checkpoint_digest(st.lora_base, topo.world().get());
  TRIDENT_REQUIRE(digest == st.lora_base_digest,
                  "checkpoint " << file << " holds LoRA adapters trained on " << st.lora_base << " (digest "
                                << st.lora_base_digest << "), which has changed since (digest " << digest << ")");
  load_checkpoint(st.lora_base, family, store, nullptr, topo, TensorSet::base);
  return st;
}

TensorParallel tensor_parallel(const Deck& deck, const Topology& topo) {
  TensorParallel tp;
  tp.comm = &topo.tp_group();
  tp.sequence_parallel = deck.parallel.sequence_parallel && topo.tp_size() > 1;
  // MoE: the experts' groups whenever they split the experts (ep 1 with expert_tp > 1 too: the
  // exchange then runs over a group of one)
  if (topo.ep_size() > 1 || topo.etp_size() > 1) tp.ep = &topo.ep_group();
  if (topo.etp_size() > 1) tp.etp = &topo.etp_group();
  if (topo.cp_size() > 1) {
    tp.cp = &topo.cp_group();
    tp.cp_a2a = deck.parallel.cp_comm_type == "a2a";
  }
  return tp;
}

// Global L2 norm of the gradients: TP-sharded parameters summed over the TP group, the
// replicated ones (identical on every TP rank by then) counted once, the stages summed over
// the pipeline group, tied copies (the last stage's word embeddings) left out. Each
// data-parallel rank sums the squares of its shard [begin, end) of the flat buffer and the
// partial sums are added over the DP group: the distributed optimizer holds only that shard of
// the reduced gradient, and the plain optimizer computes the same sum the same way (so both
// clip by the bitwise same factor).
// MoE experts: each expert-data-parallel rank sums its shard of the experts' range, the partial
// sums are added over that group (this rank's experts) and then over the expert-parallel group
// (every expert once), before the sum over the pipeline.
double global_grad_norm(const ParamStore& store, const Topology& topo, std::int64_t begin, std::int64_t end,
                        std::int64_t expert_begin, std::int64_t expert_end, RangeSquares* plan) {
  double part[2] = {0, 0};  // sharded over TP, replicated over TP
  double e[2] = {0, 0};     // experts: split over etp, replicated over etp
  const bool one_pass = kDeviceKernels && plan != nullptr;
  if (one_pass) {
    if (!plan->built()) {
      std::vector<RangeSquares::Range> ranges;
      for (const auto& p : store.params()) {
        if (p.tied_copy || p.state) continue;
        const std::int64_t lo = p.expert ? expert_begin : begin, hi = p.expert ? expert_end : end;
        const std::int64_t b = std::max(lo, p.offset), en = std::min(hi, p.offset + p.numel());
        if (b < en) ranges.push_back({b, en, (p.expert ? 2 : 0) + (p.tp_replicated ? 1 : 0)});
      }
      *plan = RangeSquares(std::move(ranges), 4);
    }
    const std::vector<double> s = plan->run(store.grads());
    part[0] = s[0];
    part[1] = s[1];
    e[0] = s[2];
    e[1] = s[3];
  }
  for (const auto& p : store.params()) {
    if (one_pass || p.tied_copy || p.expert || p.state) continue;
    const std::int64_t b = std::max(begin, p.offset), en = std::min(end, p.offset + p.numel());
    if (b >= en) continue;
    part[p.tp_replicated ? 1 : 0] += sum_squares(slice(store.grads(), b, en - b), en - b);
  }
  double sharded = topo.dp_cp_group().allreduce_sum(part[0]), replicated = topo.dp_cp_group().allreduce_sum(part[1]);
  sharded = topo.tp_group().allreduce_sum(sharded);
  double experts = 0;
  if (store.has_experts()) {
    // the experts' matrices split over expert_tp (summed over that group too) and their fc2 biases,
    // replicated over it (counted once)
    for (const auto& p : store.params()) {
      if (one_pass || !p.expert) continue;
      const std::int64_t b = std::max(expert_begin, p.offset), en = std::min(expert_end, p.offset + p.numel());
      if (b < en) e[p.tp_replicated ? 1 : 0] += sum_squares(slice(store.grads(), b, en - b), en - b);
    }
    for (double& x : e) x = topo.ep_group().allreduce_sum(topo.edp_group().allreduce_sum(x));
    experts = topo.etp_group().allreduce_sum(e[0]) + e[1];
  }
  return std::sqrt(topo.pp_group().allreduce_sum(sharded + replicated + experts));
}

std::vector<double> layer_sum_squares(const ParamStore& store, const Topology& topo, std::int64_t layers,
                                      const FloatView& values, bool grads, std::int64_t begin, std::int64_t end,
                                      std::int64_t expert_begin, std::int64_t expert_end) {
  const std::int64_t G = layers + 1;
  // [dense sharded over TP | dense replicated | experts split over expert TP | experts replicated] x G
  std::vector<double> part(static_cast<size_t>(4 * G), 0.0);
  for (const auto& p : store.params()) {
    if (p.tied_copy || p.state) continue;
    const std::int64_t lo = p.expert ? expert_begin : begin, hi = p.expert ? expert_end : end;
    const std::int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel());
    if (b >= e) continue;
    const std::int64_t g = p.layer >= 0 && p.layer < layers ? p.layer + 1 : 0;
    const std::int64_t kind = (p.expert ? 2 : 0) + (p.tp_replicated ? 1 : 0);
    part[static_cast<size_t>(kind * G + g)] += sum_squares(slice(values, b, e - b), e - b);
  }
  double* dense = part.data();
  double* experts = part.data() + 2 * G;
  if (grads) topo.dp_cp_group().allreduce_sum(dense, 2 * G);  // the shards of the data-parallel ranks
  topo.tp_group().allreduce_sum(dense, G);                    // the TP-sharded parameters' slices
  if (store.has_experts()) {
    if (grads) topo.edp_group().allreduce_sum(experts, 2 * G);
    topo.ep_group().allreduce_sum(experts, 2 * G);  // the other experts
    topo.etp_group().allreduce_sum(experts, G);
  }
  std::vector<double> out(static_cast<size_t>(G));
  for (std::int64_t g = 0; g < G; ++g)
    out[static_cast<size_t>(g)] = dense[g] + dense[G + g] + experts[g] + experts[G + g];
  topo.pp_group().allreduce_sum(out.data(), G);  // each layer lives on one stage
  return out;
}

namespace {

// Layers (first, count) of each pipeline stage without interleaving. T5 with
// parallel.pipeline_split_rank = r (Megatron's split rank): the encoder's layers evenly over
// stages [0, r), the decoder's over [r, pp).
std::vector<std::pair<std::int64_t, std::int64_t>> stage_layers(const Deck& deck, int p, const TransformerConfig& cfg) {
  const std::int64_t r = deck.parallel.pipeline_split_rank;
  if (r == 0)
    return split_layers(cfg.total_layers(), p, deck.parallel.first_stage_layers, deck.parallel.last_stage_layers);
  TRIDENT_REQUIRE(cfg.encoder_decoder(), "parallel.pipeline_split_rank is for T5's encoder-decoder (pretrain_t5) only");
  TRIDENT_REQUIRE(r < p, "parallel.pipeline_split_rank (" << r << ") must be below parallel.pp (" << p
                                                          << "): stages [0, r) hold the encoder, [r, pp) the decoder");
  TRIDENT_REQUIRE(
      deck.parallel.first_stage_layers == 0 && deck.parallel.last_stage_layers == 0,
      "parallel.pipeline_split_rank cannot be combined with parallel.first_stage_layers / last_stage_layers");
  const std::int64_t enc_stages = r, dec_stages = p - r;
  TRIDENT_REQUIRE(cfg.num_layers % enc_stages == 0,
                  "model.num_layers (" << cfg.num_layers << ", the encoder's) is not divisible by the " << enc_stages
                                       << " encoder stages of parallel.pipeline_split_rank");
  TRIDENT_REQUIRE(cfg.decoder_layers % dec_stages == 0,
                  "model.decoder_num_layers (" << cfg.decoder_layers << ") is not divisible by the " << dec_stages
                                               << " decoder stages (parallel.pp - parallel.pipeline_split_rank)");
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t k = 0; k < enc_stages; ++k)
    out.push_back({k * (cfg.num_layers / enc_stages), cfg.num_layers / enc_stages});
  for (std::int64_t k = 0; k < dec_stages; ++k)
    out.push_back({cfg.num_layers + k * (cfg.decoder_layers / dec_stages), cfg.decoder_layers / dec_stages});
  return out;
}

}  // namespace

// This rank's part of the model: one stage's layers (embeddings on the first stage, final
// LayerNorm, head and loss on the last), or, with vp > 1, vp chunks: chunk c is virtual stage
// c * pp + pp_rank of an even split over pp * vp virtual stages.
std::vector<ModelStage> chunks_of(const Deck& deck, const Topology& topo, const TransformerConfig& cfg) {
  const std::int64_t L = cfg.total_layers();
  const int p = topo.pp_size(), s = topo.coords().pp, vp = static_cast<int>(deck.parallel.vp);
  std::vector<ModelStage> out;
  if (vp == 1) {
    const auto split = stage_layers(deck, p, cfg);
    ModelStage st;
    st.first_layer = split[s].first;
    st.num_layers = split[s].second;
    st.pre = topo.is_first_stage();
    st.post = topo.is_last_stage();
    return {st};
  }
  TRIDENT_REQUIRE(p > 1, "parallel.vp > 1 (interleaved schedule) needs parallel.pp > 1");
  TRIDENT_REQUIRE(!cfg.encoder_decoder(),
                  "parallel.vp > 1: the interleaved schedule is not supported for T5's encoder-decoder "
                  "(as in Megatron-LM); use parallel.vp = 1");
  TRIDENT_REQUIRE(deck.parallel.first_stage_layers == 0 && deck.parallel.last_stage_layers == 0,
                  "parallel.first_stage_layers / last_stage_layers cannot be combined with parallel.vp > 1");
  TRIDENT_REQUIRE(L % (p * vp) == 0, "model.num_layers ("
                                         << L << ") is not divisible by parallel.pp x parallel.vp = " << p << " x "
                                         << vp << " (the interleaved schedule's virtual stages)");
  const auto split = split_layers(L, p * vp, 0, 0);
  for (int c = 0; c < vp; ++c) {
    ModelStage st;
    st.first_layer = split[c * p + s].first;
    st.num_layers = split[c * p + s].second;
    st.pre = c == 0 && s == 0;
    st.post = c == vp - 1 && s == p - 1;
    out.push_back(st);
  }
  return out;
}

// T5: the pipeline stage that holds the first decoder layer (vp = 1).
int decoder_stage(const Deck& deck, const Topology& topo, const TransformerConfig& cfg) {
  const auto split = stage_layers(deck, topo.pp_size(), cfg);
  for (int s = 0; s < topo.pp_size(); ++s)
    if (split[s].first <= cfg.num_layers && cfg.num_layers < split[s].first + split[s].second) return s;
  return topo.pp_size() - 1;
}

// The model chunks of this rank, sharing one parameter store.
std::vector<std::unique_ptr<LanguageModel>> build_chunks(ModelFamily fam, const TransformerConfig& cfg,
                                                         const HeadOptions& head, ParamStore& store, std::int64_t mbs,
                                                         const TensorParallel& tp,
                                                         const std::vector<ModelStage>& stages) {
  std::vector<std::unique_ptr<LanguageModel>> out;
  for (const auto& st : stages) out.push_back(make_model(fam, cfg, store, mbs, tp, st, head));
  return out;
}

std::vector<LanguageModel*> raw(const std::vector<std::unique_ptr<LanguageModel>>& v) {
  std::vector<LanguageModel*> out;
  for (auto& m : v) out.push_back(m.get());
  return out;
}

// The loss parts of the chunks since the last call (BERT's two, T5's LM loss), summed over the
// pipeline and data-parallel groups (each value once per TP group: TP ranks hold the same).
LossParts reduce_loss_parts(const std::vector<std::unique_ptr<LanguageModel>>& chunks, const Topology& topo) {
  LossParts l;
  for (auto& chunk : chunks) l.add(chunk->take_loss_parts());
  double v[6] = {l.lm, l.sop, l.lm_sum, l.lm_count, l.sop_sum, l.sop_count};
  for (double& x : v) x = topo.dp_cp_group().allreduce_sum(topo.pp_group().allreduce_sum(x));
  return LossParts{v[0], v[1], v[2], v[3], v[4], v[5]};
}

void start_moe_iteration(const std::vector<std::unique_ptr<LanguageModel>>& chunks, float aux_grad_scale) {
  for (auto& chunk : chunks)
    if (MoeState* m = chunk->moe_state()) {
      m->reset();
      m->aux_grad_scale = aux_grad_scale;
    }
}

MoeReport reduce_moe_report(const std::vector<std::unique_ptr<LanguageModel>>& chunks, const ModelArch& arch,
                            const Topology& topo) {
  MoeReport r;
  const MoeArch& moe = arch.moe;
  if (!moe.on()) return r;
  for (std::int64_t l = 0; l < static_cast<std::int64_t>(moe.layers.size()); ++l)
    if (moe.layer(l)) r.layers.push_back(l);
  const std::int64_t E = moe.num_experts, L = static_cast<std::int64_t>(r.layers.size()), W = 4 + E;
  // per MoE layer: [aux, z, micro-batches, dropped, selections per expert], summed over the world
  // (TP ranks add their parts of the aux loss and their means of the z-loss, counted in micro)
  std::vector<double> v(static_cast<size_t>(L * W), 0.0);
  for (auto& chunk : chunks) {
    const MoeState* m = chunk->moe_state();
    if (!m) continue;
    for (const auto& [layer, st] : m->layers) {
      const auto at = std::find(r.layers.begin(), r.layers.end(), layer);
      if (at == r.layers.end()) continue;
      double* row = v.data() + (at - r.layers.begin()) * W;
      row[0] += st.aux;
      row[1] += st.z;
      row[2] += static_cast<double>(st.micro);
      row[3] += st.dropped;
      for (std::int64_t e = 0; e < E && e < static_cast<std::int64_t>(st.selected.size()); ++e)
        row[4 + e] += st.selected[static_cast<size_t>(e)];
    }
  }
  topo.world().allreduce_sum(v.data(), static_cast<std::int64_t>(v.size()));
  const double tp = static_cast<double>(topo.tp_size());
  double selected = 0, dropped = 0;
  for (std::int64_t i = 0; i < L; ++i) {
    const double* row = v.data() + i * W;
    const double micro = row[2];  // micro-batches x TP ranks
    if (micro <= 0) continue;
    r.aux += row[0] / (micro / tp);
    r.z += row[1] / micro;
    double sum = 0, mx = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      sum += row[4 + e];
      mx = std::max(mx, row[4 + e]);
    }
    r.counts.emplace_back(row + 4, row + 4 + E);
    std::vector<double> share(static_cast<size_t>(E), 0.0);
    for (std::int64_t e = 0; e < E; ++e) share[static_cast<size_t>(e)] = sum > 0 ? row[4 + e] / sum : 0.0;
    r.load.push_back(share);
    r.max_load += sum > 0 ? mx / (sum / static_cast<double>(E)) : 0.0;
    selected += sum;
    dropped += row[3];
  }
  if (L > 0) {
    r.aux /= static_cast<double>(L);
    r.z /= static_cast<double>(L);
    r.max_load /= static_cast<double>(L);
  }
  r.dropped = selected > 0 ? dropped / selected : 0.0;
  return r;
}

void update_expert_bias(const std::vector<std::unique_ptr<LanguageModel>>& chunks, const MoeReport& report,
                        double rate) {
  for (auto& chunk : chunks) {
    MoeState* m = chunk->moe_state();
    if (!m) continue;
    for (const auto& [layer, bias] : m->expert_bias) {
      const auto at = std::find(report.layers.begin(), report.layers.end(), layer);
      TRIDENT_REQUIRE(at != report.layers.end(), "internal: no MoE report of layer " << layer);
      const std::vector<double>& c = report.counts[static_cast<size_t>(at - report.layers.begin())];
      double mean = 0;
      for (double x : c) mean += x;
      mean /= static_cast<double>(c.size());
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bias);
      for (size_t e = 0; e < c.size(); ++e) {
        const double d = mean - c[e];
        h(e) += static_cast<float>(rate * static_cast<double>((d > 0) - (d < 0)));
      }
      Kokkos::deep_copy(bias, h);
    }
  }
}

TransformerConfig gpt_config_from_deck(const Deck& d, std::int64_t vocab, std::int64_t tp) {
  return make_config(d, vocab, tp, ModelFamily::Gpt);
}

}  // namespace trident
