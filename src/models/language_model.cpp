// The shared transformer stack (language_model.hpp): embeddings -> layers -> final LayerNorm ->
// the family's head; pipeline slots, recomputation segments, the encoder-decoder boundary.
#include "models/language_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "ops/elementwise.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

namespace {
constexpr std::uint64_t kEmbeddingSite = 0;
}

LanguageModel::LanguageModel(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch,
                             const TensorParallel& tp, const ModelStage& stage)
    : cfg_(cfg), store_(&store), tp_(tp), stage_(stage), B_(micro_batch) {
  if (stage_.num_layers < 0) stage_.num_layers = cfg.total_layers() - stage_.first_layer;
  const std::int64_t C = cfg.hidden_size, T = cfg.seq_length, p = tp.size(), r = tp.rank();
  rows_ = B_ * T;
  local_rows_ = tp.sequence_parallel ? rows_ / p : rows_;
  TRIDENT_REQUIRE(cfg.num_heads > 0 && (cfg.kv_channels > 0 || C % cfg.num_heads == 0),
                  "model.hidden_size (" << C << ") must be divisible by model.num_heads (" << cfg.num_heads
                                        << ") unless model.kv_channels is set");
  TRIDENT_REQUIRE(cfg.num_heads % p == 0,
                  "model.num_heads (" << cfg.num_heads << ") is not divisible by parallel.tp (" << p << ")");
  TRIDENT_REQUIRE(T <= cfg.max_positions,
                  "model.seq_length (" << T << ") exceeds model.max_position_embeddings (" << cfg.max_positions << ")");
  TRIDENT_REQUIRE(cfg.padded_vocab >= cfg.vocab_size && cfg.padded_vocab % p == 0,
                  "padded vocabulary " << cfg.padded_vocab << " does not split over tp = " << p);
  TRIDENT_REQUIRE(!tp.sequence_parallel || rows_ % p == 0,
                  "sequence parallelism splits micro_batch_size x seq_length = " << rows_ << " tokens over tp = " << p
                                                                                 << ": not divisible");
  TRIDENT_REQUIRE(!cfg.layer.cross_attention, "the first stack's layers cannot cross-attend (no encoder before them)");
  if (cfg.encoder_decoder()) {
    const std::int64_t Td = cfg.decoder_seq_length;
    TRIDENT_REQUIRE(Td > 0, "an encoder-decoder (T5) needs model.decoder_seq_length > 0");
    TRIDENT_REQUIRE(cfg.decoder_layer.cross_attention, "an encoder-decoder's decoder layers must cross-attend");
    TRIDENT_REQUIRE(Td <= cfg.max_positions, "model.decoder_seq_length (" << Td
                                                                          << ") exceeds model.max_position_embeddings ("
                                                                          << cfg.max_positions << ")");
    dec_rows_ = B_ * Td;
    dec_local_rows_ = tp.sequence_parallel ? dec_rows_ / p : dec_rows_;
    TRIDENT_REQUIRE(!tp.sequence_parallel || dec_rows_ % p == 0,
                    "sequence parallelism splits micro_batch_size x decoder_seq_length = "
                        << dec_rows_ << " tokens over tp = " << p << ": not divisible");
    // The chunk holding the first decoder layer computes the encoder output (the encoder's final
    // LayerNorm) and the decoder's embeddings; chunks after it receive the encoder output with
    // the decoder's hidden states and send its gradient back with theirs.
    const std::int64_t L = cfg.num_layers, first = stage_.first_layer, end = first + stage_.num_layers;
    if (first <= L && L < end) dec_start_ = L - first;
    in_dec_ = !stage_.pre && first > L;
    out_dec_ = !stage_.post && end > L;
  }
  vocab_local_ = cfg.padded_vocab / p;
  vocab_start_ = r * vocab_local_;

  ParamInfo wte;                // vocabulary-parallel: rows [start, start + Vl) of the padded table
  wte.tied_copy = !stage_.pre;  // a later stage's copy of the first stage's table (head, decoder)
  wte.name = "model/embedding/word_embeddings";
  wte.shape = {vocab_local_, C};
  wte.global_shape = {cfg.vocab_size, C};
  wte.global_offset = {std::min(vocab_start_, cfg.vocab_size), 0};
  wte.valid = {std::max<std::int64_t>(0, std::min(vocab_local_, cfg.vocab_size - vocab_start_)), C};
  wte.tp_replicated = false;
  wte.weight_decay = true;
  wte.init_std = cfg.init_std();
  const bool embeds = stage_.pre || dec_start_ >= 0;  // the first stack's or the decoder's embeddings
  const bool untied = cfg.untie_embeddings_and_output_weights;
  if (embeds || (stage_.post && !untied)) wte_ = store.declare(wte);
  if (embeds && cfg.learned_positions()) {
    ParamInfo wpe;  // one table for the encoder and the decoder
    wpe.name = "model/embedding/position_embeddings";
    wpe.shape = wpe.global_shape = wpe.valid = {cfg.max_positions, C};
    wpe.global_offset = {0, 0};
    wpe.tied_copy = !stage_.pre;
    wpe.weight_decay = true;
    wpe.init_std = cfg.init_std();
    wpe_ = store.declare(wpe);
  }
  if (stage_.pre && cfg.num_token_types > 0)
    tte_ = store.declare("model/embedding/tokentype_embeddings", {cfg.num_token_types, C}, true, cfg.init_std());

  TransformerShape ts;
  static_cast<ModelArch&>(ts) = cfg;  // the architecture, whole
  ts.B = B_;
  ts.T = T;
  ts.max_positions = cfg.max_positions;
  ts.out_init_std = cfg.init_std() / std::sqrt(2.0f * static_cast<float>(cfg.total_layers()));
  ts.tp = tp;
  ts.dt = cfg.dt;
  ts.causal = cfg.layer.mask == MaskKind::Causal;
  ts.lora = LoraSpec{cfg.lora_rank, cfg.lora_scale};
  ts.lora_targets = cfg.lora_targets;
  if (cfg.moe.on()) ts.moe_state = moe_state_ = std::make_shared<MoeState>();
  TransformerShape ds = ts;  // an encoder-decoder's decoder layers
  ds.T = cfg.decoder_seq_length;
  ds.causal = cfg.decoder_layer.mask == MaskKind::Causal;
  ds.Tk = T;
  for (std::int64_t l = stage_.first_layer; l < stage_.first_layer + stage_.num_layers; ++l) {
    const ParamStore::LayerScope scope(store, l);  // the layer's parameters know their layer
    const bool decoder = cfg.encoder_decoder() && l >= cfg.num_layers;
    layers_.push_back(std::make_unique<TransformerLayer>(store, layer_param_prefix(cfg, l), l, decoder ? ds : ts));
  }
  if (dec_start_ >= 0) enc_lnf_ = Norm(store, "model/encoder/final_layernorm", C, cfg);
  if (stage_.post)
    lnf_ = Norm(store, cfg.encoder_decoder() ? "model/decoder/final_layernorm" : "model/final_layernorm", C, cfg);
  if (stage_.post && untied) {  // the output layer, laid out as the word embeddings (vocabulary-parallel)
    ParamInfo out = wte;
    out.name = "model/output_layer/weight";
    out.tied_copy = false;
    out_ = store.declare(out);
  }
  const bool selective = cfg.recompute == TransformerConfig::Recompute::Selective && !cfg.flash_attention;
  const std::int64_t n = static_cast<std::int64_t>(layers_.size());
  // first local decoder layer (n: none)
  const std::int64_t boundary = cfg.encoder_decoder()
                                    ? std::clamp(cfg.num_layers - stage_.first_layer, std::int64_t{0}, n)
                                    : n;
  if (boundary > 0 || !cfg.encoder_decoder()) scratch_[0] = std::make_unique<TransformerScratch>(ts, selective);
  if (boundary < n) scratch_[1] = std::make_unique<TransformerScratch>(ds, selective);
  for (std::int64_t l = 0; l < n; ++l) layers_[static_cast<size_t>(l)]->prepare_scratch(*scratch_[part(l)]);

  // Recomputation segments over this chunk's layers (per part: no segment crosses from the
  // encoder to the decoder).
  TRIDENT_REQUIRE(cfg.recompute != TransformerConfig::Recompute::Full || cfg.recompute_num_layers >= 1,
                  "precision.recompute_num_layers must be at least 1 with precision.recompute = full");
  std::int64_t max_recompute[2] = {0, 0};
  for (const auto& [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, boundary}, {boundary, n}}) {
    for (std::int64_t l = begin; l < end;) {
      Segment g;
      g.first = l;
      if (cfg.recompute == TransformerConfig::Recompute::Full && !cfg.recompute_block) {
        g.count = std::min(cfg.recompute_num_layers, end - l);
        g.recompute = true;
      } else {
        g.recompute = cfg.recompute == TransformerConfig::Recompute::Full && l - begin < cfg.recompute_num_layers;
      }
      for (std::int64_t k = 0; k < g.count; ++k) segment_of_.push_back(static_cast<std::int64_t>(segments_.size()));
      if (g.recompute) max_recompute[part(l)] = std::max(max_recompute[part(l)], g.count);
      segments_.push_back(g);
      l += g.count;
    }
  }
  for (int q = 0; q < 2; ++q)
    for (std::int64_t j = 0; j < max_recompute[q]; ++j) {
      const std::int64_t l = (q ? boundary : 0) + j;
      workspace_[q].push_back(layers_[static_cast<size_t>(l)]->make_activations(*scratch_[q], true));
    }

  const std::int64_t Rmax = std::max(local_rows_, dec_local_rows_);
  const std::int64_t BTmax = std::max(rows_, dec_rows_);
  dres_ = make_float("model::dres", Rmax * C);
  if (embeds) word_ = make_float("model::word", BTmax * C);
  // encoder-decoder pipeline messages: [hidden states (R_d or R rows) | encoder output (R rows)],
  // one size for every boundary (NCCL's sends and receives must match)
  message_size_ = cfg.encoder_decoder() ? (local_rows_ + dec_local_rows_) * C : local_rows_ * C;
  if (message_size_ > Rmax * C) dres_ = make_float("model::dres", message_size_);
}

void LanguageModel::attach_head(std::unique_ptr<ModelHead> head) {
  TRIDENT_REQUIRE(stage_.post && !head_, "internal: a head belongs to the last stage, once");
  const std::int64_t C = cfg_.hidden_size, R = local_rows_of(cfg_.encoder_decoder() ? 1 : 0), BT = head_rows();
  head_ = std::move(head);
  lnf_out_ = make_act(cfg_.dt, "model::lnf_out", R * C);
  lnf_mean_ = make_float("model::lnf_mean", R);
  lnf_rstd_ = make_float("model::lnf_rstd", R);
  dlnf_ = make_float("model::dlnf", R * C);
  head_in_ = tp_.sequence_parallel ? make_act(cfg_.dt, "model::head_in", BT * C) : lnf_out_;
  dhead_ = head_->grad_in_norm_buffer() ? dlnf_ : make_float("model::dhead", BT * C);
}

MicroBatch LanguageModel::allocate_micro_batch() const {
  MicroBatch mb;
  const std::int64_t rows = rows_;
  mb.tokens = make_int("micro_batch::tokens", rows);
  mb.targets = make_int("micro_batch::targets", head_rows());
  if (cfg_.num_token_types > 0) mb.types = make_int("micro_batch::types", rows);
  if (cfg_.padding_mask()) mb.padding = make_int("micro_batch::padding", rows);
  if (cfg_.reset_position_ids) mb.positions = make_int("micro_batch::positions", rows);
  if (cfg_.reset_attention_mask) mb.doc_start = make_int("micro_batch::doc_start", rows);
  if constexpr (kDeviceKernels) {
    mb.token_order = make_int("micro_batch::token_order", rows);
    if (cfg_.reset_position_ids) mb.position_order = make_int("micro_batch::position_order", rows);
    if (cfg_.padding_mask()) mb.padding_len = make_int("micro_batch::padding_len", B_);
  }
  if (cfg_.encoder_decoder()) mb.dec_tokens = make_int("micro_batch::dec_tokens", dec_rows_);
  allocate_head_inputs(mb);
  return mb;
}

double LanguageModel::forward(const IntView& tokens, const IntView& targets, std::int64_t samples) {
  MicroBatch mb;
  mb.tokens = tokens;
  mb.targets = targets;
  return forward(mb, samples);
}

double LanguageModel::forward_backward(const IntView& tokens, const IntView& targets, float dscale,
                                       const DropoutStreams& rng) {
  MicroBatch mb;
  mb.tokens = tokens;
  mb.targets = targets;
  return forward_backward(mb, dscale, rng);
}

double LanguageModel::forward(const MicroBatch& mb, std::int64_t samples) {
  return stage_forward(0, mb, FloatView(), false, 0.f, DropoutStreams{}, samples);
}

double LanguageModel::forward_backward(const MicroBatch& mb, float dscale, const DropoutStreams& rng) {
  const double loss = stage_forward(0, mb, FloatView(), true, dscale, rng);
  stage_backward(0, FloatView());
  return loss + take_device_loss();
}

LanguageModel::Slot& LanguageModel::slot(int i) {
  while (static_cast<int>(slots_.size()) <= i) {
    Slot s;
    s.input = make_float("model::stage_input", message_size_);
    const std::int64_t C = cfg_.hidden_size;
    if (stage_.post) s.head_grad = make_float("model::head_grad", local_rows_of(cfg_.encoder_decoder() ? 1 : 0) * C);
    if (stage_.pre) s.tokens = make_int("model::tokens", rows_);
    if (stage_.pre && cfg_.num_token_types > 0) s.types = make_int("model::types", rows_);
    if (cfg_.padding_mask()) s.padding = make_int("model::padding", rows_);
    if (cfg_.reset_position_ids) s.positions = make_int("model::positions", rows_);
    if constexpr (kDeviceKernels) {
      if (stage_.pre) s.token_order = make_int("model::token_order", rows_);
      if (stage_.pre && cfg_.reset_position_ids) s.position_order = make_int("model::position_order", rows_);
      if (cfg_.padding_mask()) s.padding_len = make_int("model::padding_len", B_);
    }
    if (cfg_.reset_attention_mask) s.doc_start = make_int("model::doc_start", rows_);
    if (dec_start_ >= 0) {
      s.dec_tokens = make_int("model::dec_tokens", dec_rows_);
      s.dec_input = make_float("model::dec_input", dec_local_rows_ * C);
      s.enc_mean = make_float("model::enc_mean", local_rows_);
      s.enc_rstd = make_float("model::enc_rstd", local_rows_);
    }
    if (dec_start_ >= 0 || in_dec_) {
      s.enc_out = make_act(cfg_.dt, "model::enc_out", local_rows_ * C);
      s.denc = make_float("model::denc", local_rows_ * C);
    }
    if (cfg_.encoder_decoder() && !stage_.post) s.send = make_float("model::send", message_size_);
    const bool selective = cfg_.recompute == TransformerConfig::Recompute::Selective && !cfg_.flash_attention;
    for (std::int64_t l = 0; l < static_cast<std::int64_t>(layers_.size()); ++l)
      s.acts.push_back(segments_[segment_of_[l]].recompute
                           ? LayerActivations{}
                           : layers_[l]->make_activations(*scratch_[part(l)], !selective));
    for (const Segment& g : segments_)
      s.seg_out.push_back(g.recompute ? make_float("model::segment_out", local_rows_of(part(g.first)) * C)
                                      : FloatView());
    slots_.push_back(s);
  }
  return slots_[i];
}

LayerActivations LanguageModel::activations(Slot& s, std::int64_t l) {
  const std::int64_t g = segment_of_[l];
  const Segment& seg = segments_[g];
  if (!seg.recompute) return s.acts[l];  // a copy of the handles: the same buffers
  LayerActivations a = workspace_[part(l)][l - seg.first];
  if (l == seg.first + seg.count - 1) a.out = s.seg_out[g];
  return a;
}

FloatView LanguageModel::segment_input(const Slot& s, std::int64_t g) const {
  const std::int64_t first = segments_[g].first;
  if (first == dec_start_) return s.dec_input;  // T5: the decoder starts from its embeddings
  return first == 0 ? chunk_input(s) : layer_output(s, first - 1);
}

// Output of layer l; persistent per slot for a kept layer and for the last layer of a
// recomputed segment, the workspace's otherwise (valid only during that segment's passes).
FloatView LanguageModel::layer_output(const Slot& s, std::int64_t l) const {
  const std::int64_t g = segment_of_[l];
  const Segment& seg = segments_[g];
  if (!seg.recompute) return s.acts[l].out;
  if (l == seg.first + seg.count - 1) return s.seg_out[g];
  return workspace_[part(l)][l - seg.first].out;
}

std::int64_t LanguageModel::activation_bytes_per_slot() const {
  if (slots_.empty()) return 0;
  const Slot& s = slots_.front();
  std::int64_t n = static_cast<std::int64_t>(s.input.span() + s.head_grad.span() + s.tokens.span() + s.types.span() +
                                             s.padding.span() + s.padding_len.span() + s.positions.span() +
                                             s.doc_start.span() + s.token_order.span() + s.position_order.span() +
                                             s.dec_tokens.span() + s.dec_input.span() + s.enc_mean.span() +
                                             s.enc_rstd.span() + s.denc.span() + s.send.span()) *
                       4 +
                   s.enc_out.bytes();
  for (const auto& a : s.acts) n += a.bytes();
  for (const auto& o : s.seg_out) n += static_cast<std::int64_t>(o.span()) * 4;
  return n;
}

double LanguageModel::layer_activation_bytes() const {
  if (slots_.empty() || layers_.empty()) return 0;
  const Slot& s = slots_.front();
  std::int64_t n = 0;
  for (const auto& a : s.acts) n += a.bytes();
  for (const auto& o : s.seg_out) n += static_cast<std::int64_t>(o.span()) * 4;
  return static_cast<double>(n) / static_cast<double>(layers_.size());
}

std::int64_t LanguageModel::workspace_bytes() const {
  std::int64_t n = 0;
  for (int q = 0; q < 2; ++q) {
    if (scratch_[q]) n += scratch_[q]->bytes();
    for (const auto& a : workspace_[q]) n += a.bytes();
  }
  for (const FloatView* v : {&word_, &lnf_mean_, &lnf_rstd_, &dres_, &dlnf_, &dhead_})
    n += static_cast<std::int64_t>(v->span()) * 4;
  n += lnf_out_.bytes();
  if (head_) n += head_->workspace_bytes();
  if (tp_.sequence_parallel) n += head_in_.bytes();
  return n;
}

DropoutSpec LanguageModel::embedding_dropout(const DropoutStreams& rng) const {
  DropoutSpec d;
  if (!rng.training || cfg_.hidden_dropout <= 0.f) return d;
  d.p = cfg_.hidden_dropout;
  d.key = dropout_key(tp_.sequence_parallel ? rng.tp_local : rng.shared, rng.step,
                      static_cast<std::uint64_t>(cfg_.total_layers()), kEmbeddingSite);
  if (tp_.cp_size() > 1) {  // rows of whole sequences (ops/dropout.hpp)
    d.cp = tp_.cp_size();
    d.cp_rank = tp_.cp->rank();
    d.Tl = cfg_.seq_length;
    d.row0 = tp_.sequence_parallel ? tp_.rank() * (local_rows_) : 0;
  }
  return d;
}

// Vocabulary-parallel embedding: partial lookups summed over TP (reduce_from), or
// reduce-scattered to the row split with sequence parallelism; then positions (and token
// types), dropout. out: (R, C) of B * T tokens.
void LanguageModel::embed(const FloatView& out, const IntView& tokens, const IntView& types, std::int64_t T,
                          const DropoutStreams& rng, bool training, int which, const IntView& positions) {
  const std::int64_t C = cfg_.hidden_size, BT = B_ * T, R = tp_.sequence_parallel ? BT / tp_.size() : BT;
  const std::int64_t row0 = tp_.sequence_parallel ? tp_.rank() * R : 0;
  const FloatView word = slice(word_, 0, BT * C);
  embedding_lookup(word, tokens, store_->param(wte_), vocab_start_, vocab_local_, BT, C);
  if (tp_.sequence_parallel) {
    ReduceScatterToSequenceParallelRegion::forward(tp_, out, word, BT, C);
  } else {
    ReduceFromTensorParallelRegion::forward(tp_, word, BT * C);
    device_copy(out, word);
  }
  if (wpe_ >= 0) add_positions(out, store_->param(wpe_), row0, R, T, C, positions);
  if (tte_ >= 0) {  // token types of this rank's rows; word_ is free again
    embedding_lookup(word_, slice(types, row0, R), store_->param(tte_), 0, cfg_.num_token_types, R, C);
    accumulate(out, word_, R * C);
  }
  DropoutSpec d = training ? embedding_dropout(rng) : DropoutSpec{};
  if (d.active() && which) d.key = dropout_key(d.key, rng.step, 1, 1);  // the decoder's own mask
  record_dropout(which ? "decoder_embedding" : "embedding", -1, d, {R, C});
  dropout_forward(out, out, R * C, d, C);
}

// Backward of embed: dout (R, C) is consumed (dropout applied in place).
void LanguageModel::embed_backward(const FloatView& dout, const IntView& tokens, const IntView& types, std::int64_t T,
                                   const DropoutStreams& rng, int which, const IntView& positions,
                                   const IntView& token_order, const IntView& position_order) {
  const std::int64_t C = cfg_.hidden_size, BT = B_ * T, R = tp_.sequence_parallel ? BT / tp_.size() : BT;
  const std::int64_t row0 = tp_.sequence_parallel ? tp_.rank() * R : 0;
  DropoutSpec d = embedding_dropout(rng);
  if (d.active() && which) d.key = dropout_key(d.key, rng.step, 1, 1);
  dropout_backward(dout, dout, R * C, d, C);
  if (wpe_ >= 0) add_positions_backward(store_->grad(wpe_), dout, row0, R, T, C, positions, position_order);
  // the word-embedding gradient needs every row: all-gather the row split (reduce-scatter's
  // backward); without sequence parallelism dout is already complete on every TP rank.
  FloatView dword = dout;
  if (tp_.sequence_parallel) {
    dword = slice(word_, 0, BT * C);
    ReduceScatterToSequenceParallelRegion::backward(tp_, dword, dout, R, C);
  }
  embedding_lookup_backward(store_->grad(wte_), dword, tokens, vocab_start_, vocab_local_, BT, C, token_order);
  if (tte_ >= 0)
    embedding_lookup_backward(store_->grad(tte_), dout, slice(types, row0, R), 0, cfg_.num_token_types, R, C);
}

// Final LayerNorm, then the head on every row (the hidden states enter the head's TP region by
// copy, or by an all-gather of the row split); when training, the head's input gradient back
// through the LayerNorm into the slot's head_grad.
double LanguageModel::run_head(int slot_index, const MicroBatch& mb, bool training, float dscale,
                               std::int64_t samples) {
  const bool ed = cfg_.encoder_decoder();
  const std::int64_t C = cfg_.hidden_size, BT = ed ? dec_rows_ : rows_, R = ed ? dec_local_rows_ : local_rows_;
  const bool sp = tp_.sequence_parallel;
  Slot& s = slot(slot_index);
  const FloatView last = layers_.empty() ? chunk_input(s)
                                         : layer_output(s, static_cast<std::int64_t>(layers_.size()) - 1);
  lnf_.forward(lnf_out_, lnf_mean_, lnf_rstd_, last, R);
  if (sp) GatherFromSequenceParallelRegion::forward(tp_, head_in_, lnf_out_, R, C);
  const double loss = head_->run(head_in_, mb, training, dscale, samples, dhead_);
  if (!training) return loss;
  if (sp)
    GatherFromSequenceParallelRegion::backward(tp_, dlnf_, dhead_, BT, C);  // partial sums -> my rows
  else if (dlnf_.data() != dhead_.data())
    device_copy(dlnf_, dhead_);
  device_copy(s.head_grad, 0.f);
  lnf_.backward(s.head_grad, dlnf_, last, lnf_mean_, lnf_rstd_, R);
  return loss;
}

void LanguageModel::run_layer_forward(Slot& s, std::int64_t l, const FloatView& x, LayerActivations& a) {
  if (part(l))  // decoder layer: cross-attention over the encoder output
    layers_[l]->forward(x, s.rng, a, *scratch_[1], TokenInfo{}, s.enc_out, s.padding);
  else
    layers_[l]->forward(x, s.rng, a, *scratch_[0],
                        TokenInfo{s.padding, s.doc_start, s.positions, s.padding_lengths ? s.padding_len : IntView()});
}

double LanguageModel::stage_forward(int slot_index, const MicroBatch& mb, const FloatView& input, bool training,
                                    float dscale, const DropoutStreams& rng, std::int64_t samples) {
  Slot& s = slot(slot_index);
  s.rng = training ? rng : DropoutStreams{};
  // the per-token masks and positions are kept until the slot's backward pass
  if (cfg_.padding_mask()) device_copy(s.padding, mb.padding);
  s.padding_lengths = mb.padding_lengths && mb.padding_len.extent(0) == s.padding_len.extent(0);
  if (s.padding_lengths) device_copy(s.padding_len, mb.padding_len);
  if (cfg_.reset_position_ids) device_copy(s.positions, mb.positions);
  if (cfg_.reset_attention_mask) device_copy(s.doc_start, mb.doc_start);
  if (stage_.pre) {
    embed(chunk_input(s), mb.tokens, mb.types, cfg_.seq_length, s.rng, training, 0, s.positions);
    if (training) device_copy(s.tokens, mb.tokens);
    // the embedding backward's row orders (device kernels), where this micro-batch came with them
    s.token_ordered = training && mb.token_ordered && mb.token_order.extent(0) == s.token_order.extent(0);
    if (s.token_ordered) device_copy(s.token_order, mb.token_order);
    s.position_ordered = training && mb.position_ordered && mb.position_order.extent(0) == s.position_order.extent(0);
    if (s.position_ordered) device_copy(s.position_order, mb.position_order);
    if (training && tte_ >= 0) device_copy(s.types, mb.types);
  } else {
    device_copy(s.input, slice(input, 0, activation_size()));
    if (in_dec_) {  // the encoder output travels behind the decoder's hidden states
      const FloatView enc = slice(s.input, dec_local_rows_ * cfg_.hidden_size, local_rows_ * cfg_.hidden_size);
      if (s.enc_out.is_half())
        pack_half(cfg_.dt, s.enc_out.h, enc, local_rows_ * cfg_.hidden_size);
      else
        device_copy(s.enc_out.f, enc);
    }
  }
  FloatView x = chunk_input(s);
  for (std::int64_t l = 0; l < static_cast<std::int64_t>(layers_.size()); ++l) {
    if (l == dec_start_) {  // the encoder's final LayerNorm, then the decoder's embeddings
      enc_lnf_.forward(s.enc_out, s.enc_mean, s.enc_rstd, x, local_rows_);
      if (training) device_copy(s.dec_tokens, mb.dec_tokens);
      embed(s.dec_input, mb.dec_tokens, IntView(), cfg_.decoder_seq_length, s.rng, training, 1);
      x = s.dec_input;
    }
    LayerActivations a = activations(s, l);
    run_layer_forward(s, l, x, a);
    if (!segments_[segment_of_[l]].recompute) s.acts[l] = a;  // rng and mask of this micro-batch
    x = a.out;
  }
  if (!stage_.post) {
    if (cfg_.encoder_decoder()) {  // message: the hidden states, then (decoder) the encoder output
      device_copy(slice(s.send, 0, x.extent(0)), x);
      if (out_dec_) {
        const FloatView enc = slice(s.send, dec_local_rows_ * cfg_.hidden_size, local_rows_ * cfg_.hidden_size);
        if (s.enc_out.is_half())
          unpack_half(cfg_.dt, enc, s.enc_out.h, local_rows_ * cfg_.hidden_size);
        else
          device_copy(enc, s.enc_out.f);
      }
    }
    return 0.0;
  }
  return run_head(slot_index, mb, training, dscale, samples < 0 ? B_ : samples);
}

FloatView LanguageModel::chunk_input(const Slot& s) const {
  return slice(s.input, 0, local_rows_of(layers_.empty() ? 0 : part(0)) * cfg_.hidden_size);
}

const FloatView& LanguageModel::stage_output(int slot_index) const {
  const Slot& s = slots_.at(slot_index);
  if (cfg_.encoder_decoder() && !stage_.post) return s.send;
  if (layers_.empty()) return s.input;
  const std::int64_t l = static_cast<std::int64_t>(layers_.size()) - 1;
  return segments_[segment_of_[l]].recompute ? s.seg_out[segment_of_[l]] : s.acts[l].out;
}

void LanguageModel::stage_backward(int slot_index, const FloatView& grad_output) {
  const std::int64_t C = cfg_.hidden_size, R = local_rows_;
  Slot& s = slot(slot_index);
  const int last_part = layers_.empty() ? 0 : part(static_cast<std::int64_t>(layers_.size()) - 1);
  FloatView dres = slice(dres_, 0, local_rows_of(last_part) * C);
  device_copy(dres, stage_.post ? s.head_grad : slice(grad_output, 0, dres.extent(0)));
  if (out_dec_)  // the encoder output's gradient from the later decoder layers; ours add to it
    device_copy(s.denc, slice(grad_output, dec_local_rows_ * C, R * C));
  else if (s.denc.extent(0) > 0)
    device_copy(s.denc, 0.f);
  for (std::int64_t g = static_cast<std::int64_t>(segments_.size()) - 1; g >= 0; --g) {
    const Segment& seg = segments_[g];
    const int q = part(seg.first);
    std::vector<LayerActivations> acts;
    FloatView x = segment_input(s, g);
    for (std::int64_t l = seg.first; l < seg.first + seg.count; ++l) {
      acts.push_back(activations(s, l));
      // full recomputation: the segment's forward pass again, from its kept input and with the
      // micro-batch's dropout streams (masks are regenerated, so the result is bitwise equal)
      if (seg.recompute) run_layer_forward(s, l, x, acts.back());
      x = acts.back().out;
    }
    for (std::int64_t l = seg.first + seg.count - 1; l >= seg.first; --l) {
      const FloatView in = l == seg.first ? segment_input(s, g) : acts[l - 1 - seg.first].out;
      layers_[l]->backward(dres, in, acts[l - seg.first], *scratch_[q], s.denc);
      if (final_backward && on_layer_grads_ready) {
        on_layer_grads_ready(stage_.first_layer + l);
      }
    }
    if (seg.first == dec_start_) {  // into the decoder's embeddings, then the encoder's output
      embed_backward(dres, s.dec_tokens, IntView(), cfg_.decoder_seq_length, s.rng, 1);
      dres = slice(dres_, 0, R * C);
      device_copy(dres, 0.f);
      const FloatView enc_last = dec_start_ == 0 ? chunk_input(s) : layer_output(s, dec_start_ - 1);
      enc_lnf_.backward(dres, s.denc, enc_last, s.enc_mean, s.enc_rstd, R);
    }
  }
  if (in_dec_) {  // message back: d(decoder hidden states), then d(encoder output)
    device_copy(slice(dres_, dec_local_rows_ * C, R * C), s.denc);
  }
  if (!stage_.pre) return;  // dres_ is d(stage input), sent to the previous stage
  embed_backward(dres, s.tokens, s.types, cfg_.seq_length, s.rng, 0, s.positions,
                 s.token_ordered ? s.token_order : IntView(), s.position_ordered ? s.position_order : IntView());
}

std::string LanguageModel::flops_formula() const {
  if (cfg_.encoder_decoder())
    return "GEMM FLOPs of encoder, decoder with cross-attention and LM head, no recomputation";
  const bool mha = cfg_.groups() == cfg_.num_heads && cfg_.q_width() == cfg_.hidden_size;
  if (cfg_.moe.on())
    return "Megatron, no recomputation, active parameters: 12 B s h^2 (l (1 + ng/nh + s/h) nh d/h + (F l_dense + "
           "(F_expert k + F_shared) l_moe)/h x " +
           std::string(cfg_.swiglu ? "3/2" : "1") + " + V/2h)";
  if (!cfg_.swiglu && cfg_.ffn_hidden_size == 4 * cfg_.hidden_size && mha)
    return "Megatron, no recomputation: 72 B s l h^2 (1 + s/6h + V/12hl)";
  return "Megatron, no recomputation: 12 B s l h^2 ((1 + ng/nh + s/h) nh d/h + F/h x " +
         std::string(cfg_.swiglu ? "3/2" : "1") + " + V/2lh)";
}

double LanguageModel::flops_per_step(std::int64_t tokens_batch, std::int64_t seq_length) const {
  const double s = static_cast<double>(seq_length > 0 ? seq_length : cfg_.seq_length),
               h = static_cast<double>(cfg_.hidden_size), l = static_cast<double>(cfg_.num_layers),
               V = static_cast<double>(cfg_.padded_vocab);
  const double B = static_cast<double>(tokens_batch) / s;
  if (cfg_.encoder_decoder()) {  // forward GEMM FLOPs per sample, x3 for forward + backward
    const double sd = static_cast<double>(cfg_.decoder_seq_length), ld = static_cast<double>(cfg_.decoder_layers);
    const double enc = l * (24.0 * s * h * h + 4.0 * s * s * h);
    const double dec = ld *
                       (24.0 * sd * h * h + 4.0 * sd * sd * h + 4.0 * sd * h * h + 4.0 * s * h * h + 4.0 * sd * s * h);
    return 3.0 * B * (enc + dec + 2.0 * sd * h * V);
  }
  const double F = static_cast<double>(cfg_.ffn_hidden_size);
  const bool mha = cfg_.groups() == cfg_.num_heads && cfg_.q_width() == cfg_.hidden_size;
  if (cfg_.moe.on()) {  // the MLP term over the active parameters: each token's k experts and the shared one
    const MoeArch& m = cfg_.moe;
    double moe_layers = 0;
    for (std::int64_t i = 0; i < cfg_.num_layers; ++i) moe_layers += m.layer(i) ? 1.0 : 0.0;
    const double gated = cfg_.swiglu ? 1.5 : 1.0;
    const double nh = static_cast<double>(cfg_.num_heads), ng = static_cast<double>(cfg_.groups());
    const double q_ratio = static_cast<double>(cfg_.q_width()) / h;
    const double mlp = (F * (l - moe_layers) + (static_cast<double>(m.ffn_hidden_size * m.router_topk) +
                                                static_cast<double>(m.shared_expert_intermediate_size)) *
                                                   moe_layers) /
                       h * gated;
    return 12.0 * B * s * h * h * (l * (1.0 + ng / nh + s / h) * q_ratio + mlp + V / (2.0 * h));
  }
  if (!cfg_.swiglu && F == 4.0 * h && mha)  // GPT-2's layer: the formula as it always printed
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * l));
  // Megatron's num_floating_point_operations (megatron/training/training.py): 12 B s l h^2 x
  // (attention (1 + ng/nh + s/h) x nh d/h -- q and proj, k and v of the groups, scores and
  // context --, MLP F/h, x 3/2 for a gated unit's third GEMM, logits V / (2 l h))
  const double gated = cfg_.swiglu ? 1.5 : 1.0;
  const double nh = static_cast<double>(cfg_.num_heads), ng = static_cast<double>(cfg_.groups());
  const double q_ratio = static_cast<double>(cfg_.q_width()) / h;  // multi-head: (1 + 1 + s/h) x 1, as before
  return 12.0 * B * s * l * h * h * ((1.0 + ng / nh + s / h) * q_ratio + F / h * gated + V / (2.0 * l * h));
}

}  // namespace trident
