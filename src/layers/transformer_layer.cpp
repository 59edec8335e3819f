// TransformerLayer (transformer_layer.hpp; docs/DESIGN.md "The model core"): the shared scratch
// and per-micro-batch activation buffers with their byte counts, the parameters under the
// checkpoint names of docs/DESIGN.md "Tensors", and forward / backward on the fp32 or 16-bit
// path: LayerNorm, column-parallel qkv, core attention (fused, or probabilities and context
// through GEMMs), row-parallel proj, fused bias + dropout + residual, the MLP with fused bias +
// GELU, and for decoder layers the cross-attention block in between. Dropout masks come from keys
// of (stream, step, layer, site) and are regenerated in backward ("Recomputation").
#include "layers/transformer_layer.hpp"

#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "ops/elementwise.hpp"
#include "ops/flash_attention.hpp"
#include "ops/fused.hpp"
#include "ops/gelu.hpp"
#include "ops/mixed_precision.hpp"

#include <algorithm>

namespace trident {

namespace {
enum Site : std::uint64_t { kAttentionProbs = 1, kAfterProj = 2, kAfterFc2 = 3, kCrossProbs = 4, kAfterCrossProj = 5 };
}

std::int64_t LayerActivations::bytes() const {
  std::int64_t n = 0;
  for (const FloatView* v : {&ln1_mean, &ln1_rstd, &res2, &ln2_mean, &ln2_rstd, &out, &lnx_mean, &lnx_rstd, &res3,
                             &qk_x, &qk_mean, &qk_rstd})
    n += static_cast<std::int64_t>(v->span()) * 4;
  for (const Act* v : {&ln1, &qkv, &atty, &ln2, &lnx, &cq, &ckv, &catty}) n += v->bytes();
  if (mlp) n += mlp->bytes();
  if (core) n += core->bytes();
  if (attention_kept) n += catt.bytes() + catt_drop.bytes();
  return n;
}

TransformerScratch::TransformerScratch(const TransformerShape& s, bool selective_) : selective(selective_) {
  const std::int64_t BT = s.rows(), R = s.local_rows(), p = s.tp.size(), E = s.enc_rows();
  // the (T, T) scores and probabilities: none for the fused kernel, whose self-attention keeps no
  // score matrix (cross-attention, which always takes the GEMM path, still needs (T, Tk))
  const std::int64_t Cl = s.hidden_size / p, Ql = s.q_width() / p, Wl = s.qkv_width() / p,
                     A = s.B * (s.num_heads / p) * s.T * (s.flash_attention ? s.Tk : std::max(s.T, s.Tk));
  const std::int64_t Ax = s.B * (s.num_heads / p) * s.T * s.Tk;
  dln = make_float("scratch::dln", R * s.hidden_size);
  dqkv = make_float("scratch::dqkv", BT * Wl);
  datty = make_float("scratch::datty", BT * std::max(Ql, Cl));  // Cl: the cross-attention's
  const std::int64_t Fb = mlp_dy16_width(s);
  dbranch = make_float("scratch::dbranch", R * s.hidden_size);
  datt = make_float("scratch::datt", A);
  branch = make_float("scratch::branch", R * s.hidden_size);
  if (s.tp.sequence_parallel) gathered = make_act(s.dt, "scratch::gathered", BT * s.hidden_size);
  if (s.Tk > 0) {
    dcq = make_float("scratch::dcq", BT * Cl);
    dckv = make_float("scratch::dckv", E * 2 * Cl);
    denc = make_float("scratch::denc", s.enc_local_rows() * s.hidden_size);
    if (s.tp.sequence_parallel) gathered_enc = make_act(s.dt, "scratch::gathered_enc", E * s.hidden_size);
    if (selective) {
      catt = make_act(s.dt, "scratch::catt", Ax);
      if (s.attention_dropout > 0.f) catt_drop = make_act(s.dt, "scratch::catt_drop", Ax);
    }
  }
  if (s.qk_layernorm) {
    const std::int64_t n = BT * (s.num_heads + s.groups()) / p * s.head_dim();
    qk_out = make_act(s.dt, "scratch::qk_out", n);
    qk_dout = make_float("scratch::qk_dout", n);
    qk_dx = make_float("scratch::qk_dx", n);
  }
  if (s.dt != DType::F32) {
    att32 = make_float("scratch::att32", A);
    dy16 = make_half("scratch::dy16", std::max(BT, E) * std::max({Wl, 3 * Cl, Fb, s.hidden_size}));
    ds16 = make_half("scratch::ds16", A);
  }
}

std::int64_t TransformerScratch::bytes() const {
  std::int64_t n = 0;
  for (const FloatView* v :
       {&dln, &dqkv, &datty, &dbranch, &datt, &branch, &att32, &dcq, &dckv, &denc, &qk_dout, &qk_dx})
    n += static_cast<std::int64_t>(v->span()) * 4;
  for (const auto& m : mlp) n += m.second->bytes();
  for (const auto& m : core) n += m.second->bytes();
  for (const Act* v : {&gathered, &gathered_enc, &catt, &catt_drop, &qk_out}) n += v->bytes();
  n += static_cast<std::int64_t>(dy16.span() + ds16.span()) * 2;
  return n;
}

void TransformerLayer::prepare_scratch(TransformerScratch& s) const {
  auto& m = s.mlp[mlp_->kind()];
  if (!m) m = mlp_->make_scratch();
  auto& c = s.core[core_->kind()];
  if (!c) c = core_->make_scratch(s.selective);
}

TransformerLayer::TransformerLayer(ParamStore& store, const std::string& p, std::int64_t index,
                                   const TransformerShape& s)
    : s_(s), index_(index), norm1_(store, p + "/input_layernorm", s.hidden_size, s),
      norm2_(store, p + "/post_attention_layernorm", s.hidden_size, s),
      qkv_(store, p + "/self_attention/qkv", s.hidden_size, s.qkv_width(), s.init_std(), s.tp, s.rows(),
           s.q_width() == s.kv_width() ? RowBlocks(3) : RowBlocks({s.q_width(), s.kv_width(), s.kv_width()}),
           s.lora_for("qkv"), s.qkv_bias()),
      mlp_(make_mlp(store, p + "/mlp", s, index)),
      proj_(store, p + "/self_attention/proj", s.q_width(), s.hidden_size, s.out_init_std, s.tp, s.rows(),
            s.lora_for("proj"), s.add_bias_linear) {
  mlp_->declare_output(store);
  pos_ = make_position_encoding(s, s.head_dim(), std::max(s.max_positions, s.T));
  const std::int64_t tp_size = s.tp.size();
  TRIDENT_REQUIRE(s.groups() % tp_size == 0,
                  "model.num_query_groups (" << s.groups() << ") is not divisible by parallel.tp (" << tp_size << ")");
  TRIDENT_REQUIRE(s.num_heads % s.groups() == 0, "model.num_heads ("
                                                     << s.num_heads << ") is not a multiple of model.num_query_groups ("
                                                     << s.groups() << ")");
  qk_norm_ = QkNorm(store, p + "/self_attention", s, s.num_heads / tp_size, s.groups() / tp_size, s.head_dim(),
                    s.qkv_width() / tp_size);
  if (s.tp.cp_size() > 1)
    TRIDENT_REQUIRE(s.causal && s.Tk == 0 && s.flash_attention,
                    "context parallelism (parallel.cp > 1) serves causal self-attention on the fused kernel "
                    "(model.flash_attention = true)");
  core_ = make_attention_core(attention_core_name(s), s);
  const std::int64_t tp = s.tp.size();
  if (s.Tk > 0) {  // decoder layer: cross-attention (parameters declared after the self-attention's and the MLP's)
    normx_ = Norm(store, p + "/cross_attention_layernorm", s.hidden_size, s);
    cq_ = ColumnParallelLinear(store, p + "/cross_attention/q", s.hidden_size, s.hidden_size, s.init_std(), s.tp,
                               s.rows(), 1, s.lora_for("cross_q"), s.add_bias_linear);
    ckv_ = ColumnParallelLinear(store, p + "/cross_attention/kv", s.hidden_size, 2 * s.hidden_size, s.init_std(), s.tp,
                                s.enc_rows(), 2, s.lora_for("cross_kv"), s.add_bias_linear);
    cproj_ = RowParallelLinear(store, p + "/cross_attention/proj", s.hidden_size, s.hidden_size, s.out_init_std, s.tp,
                               s.rows(), s.lora_for("cross_proj"), s.add_bias_linear);
    TRIDENT_REQUIRE(!s.tp.sequence_parallel || s.enc_rows() % tp == 0,
                    "sequence parallelism splits micro_batch_size x encoder_seq_length = "
                        << s.enc_rows() << " tokens over tp = " << tp << ": not divisible");
  }
  TRIDENT_REQUIRE(s.num_heads % tp == 0,
                  "model.num_heads (" << s.num_heads << ") is not divisible by parallel.tp (" << tp << ")");
  TRIDENT_REQUIRE(s.ffn_hidden_size % tp == 0,
                  "model.ffn_hidden_size (" << s.ffn_hidden_size << ") is not divisible by parallel.tp (" << tp << ")");
  TRIDENT_REQUIRE(!s.tp.sequence_parallel || s.rows() % tp == 0,
                  "sequence parallelism splits micro_batch_size x seq_length = " << s.rows() << " tokens over tp = "
                                                                                 << tp << ": not divisible");
}

LayerActivations TransformerLayer::make_activations(const TransformerScratch& scratch, bool keep_attention) const {
  const TransformerShape& s = s_;
  const DType dt = s.dt;
  const std::int64_t tp = s.tp.size();
  const std::int64_t BT = s.rows(), R = s.local_rows(), C = s.hidden_size, Cl = C / tp, nhl = s.num_heads / tp;
  LayerActivations a;
  a.ln1 = make_act(dt, "layer::ln1", R * C);
  a.ln1_mean = make_float("layer::ln1_mean", R);
  a.ln1_rstd = make_float("layer::ln1_rstd", R);
  a.qkv = make_act(dt, "layer::qkv", BT * qkv_local());
  if (qk_norm_.on()) {
    a.qk_x = make_float("layer::qk_x", qk_norm_.kept(BT));
    a.qk_mean = make_float("layer::qk_mean", qk_norm_.stats(BT));
    a.qk_rstd = make_float("layer::qk_rstd", qk_norm_.stats(BT));
  }
  // the fused kernel recomputes nothing: its layers keep their cross-attention probabilities too
  a.attention_kept = keep_attention || s.flash_attention;
  a.core = core_->make_kept(*scratch.core.at(core_->kind()), keep_attention);
  a.atty = make_act(dt, "layer::atty", BT * q_local());
  a.res2 = make_float("layer::res2", R * C);
  if (s.Tk > 0) {
    const std::int64_t Ax = s.B * nhl * s.T * s.Tk;
    a.lnx = make_act(dt, "layer::lnx", R * C);
    a.lnx_mean = make_float("layer::lnx_mean", R);
    a.lnx_rstd = make_float("layer::lnx_rstd", R);
    a.cq = make_act(dt, "layer::cq", BT * Cl);
    a.ckv = make_act(dt, "layer::ckv", s.enc_rows() * 2 * Cl);
    if (keep_attention || s.flash_attention) {  // cross-attention always takes the GEMM path
      a.catt = make_act(dt, "layer::catt", Ax);
      if (s.attention_dropout > 0.f) a.catt_drop = make_act(dt, "layer::catt_drop", Ax);
    } else {
      a.catt = scratch.catt;
      a.catt_drop = scratch.catt_drop;
    }
    a.catty = make_act(dt, "layer::catty", BT * Cl);
    a.res3 = make_float("layer::res3", R * C);
  }
  a.ln2 = make_act(dt, "layer::ln2", R * C);
  a.ln2_mean = make_float("layer::ln2_mean", R);
  a.ln2_rstd = make_float("layer::ln2_rstd", R);
  a.mlp = mlp_->make_kept();
  a.out = make_float("layer::out", R * C);
  return a;
}

DropoutSpec TransformerLayer::spec(const DropoutStreams& rng, float p, std::uint64_t site, bool tp_region) const {
  DropoutSpec d;
  if (!rng.training || p <= 0.f) return d;
  d.p = p;
  d.key = dropout_key(tp_region ? rng.tp_local : rng.shared, rng.step, static_cast<std::uint64_t>(index_), site);
  if (s_.tp.cp_size() > 1 && site != kAttentionProbs) {  // rows of whole sequences (ops/dropout.hpp);
                                                         // the attention kernels count globally
    d.cp = s_.tp.cp_size();
    d.cp_rank = s_.tp.cp->rank();
    d.Tl = s_.T;
    d.row0 = s_.tp.sequence_parallel ? s_.tp.rank() * s_.local_rows() : 0;
  }
  return d;
}

std::string TransformerLayer::attention_summary() const { return attention_core_summary(s_); }

AttentionIo TransformerLayer::attention_io(const LayerActivations& a, const TransformerScratch& s) const {
  return {a.qkv, a.atty, s.dqkv, s.datty, s.attention(), a.mask};
}

void TransformerLayer::forward(const FloatView& x, const DropoutStreams& rng, LayerActivations& a,
                               TransformerScratch& s, const TokenInfo& tok, const Act& enc, const IntView& enc_valid) {
  a.rng = rng;
  a.enc = enc;
  a.mask = AttentionMask{s_.causal, tok.key_valid, tok.doc_start, tok.key_len};
  a.positions = tok.positions;
  const std::int64_t R = s_.local_rows(), C = s_.hidden_size, p = s_.tp.size();
  const bool sp = s_.tp.sequence_parallel;
  const AttentionShape as = attention_shape(s_.B, s_.T);
  const DropoutSpec att_spec = spec(rng, s_.attention_p(), kAttentionProbs, true);
  record_dropout("attention_probs", index_, att_spec, {s_.B, s_.num_heads / p, s_.T, s_.T});
  norm1_.forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, R);
  qkv_.forward(a.qkv, a.ln1, s.gathered, s.dqkv);  // (BT, W_l)
  qk_norm_.forward(a.qkv, s_.rows(), a.qk_x, a.qk_mean, a.qk_rstd, s.qk_out);
  pos_->apply(a.qkv, rope_layout(s_.rows()), a.positions);
  core_->forward(attention_io(a, s), *a.core, core_scratch(s), as, att_spec);
  proj_.forward(s.branch, a.atty, false);  // (R, C), bias left to the fused kernel
  const DropoutSpec proj_spec = spec(rng, s_.hidden_p(), kAfterProj, sp);
  record_dropout("after_proj", index_, proj_spec, {R, C});
  const ResidualAdd after_attention{x, s.branch, proj_.bias(), proj_spec};  // res2 = x + dropout(branch + bias)
  if (cross()) {
    bias_dropout_add(a.res2, x, s.branch, proj_.bias(), R, C, proj_spec);
    cross_forward(a, s, enc_valid);
    norm2_.forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res3, R);
  } else {
    norm2_.forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, R, after_attention);  // one kernel on the device path
  }
  const FloatView& mlp_in = cross() ? a.res3 : a.res2;  // (R, C)
  mlp_->forward(s.branch, a.ln2, *a.mlp, *s.mlp.at(mlp_->kind()),
                {s.gathered, s.dy16});  // (R, C) before its output bias
  const DropoutSpec fc2_spec = spec(rng, s_.hidden_p(), kAfterFc2, sp);
  record_dropout("after_fc2", index_, fc2_spec, {R, C});
  bias_dropout_add(a.out, mlp_in, s.branch, mlp_->output_bias(), R, C, fc2_spec);
}

// The rotated heads of qkv rows: this rank's query heads, then its key heads, after them.
RopeLayout TransformerLayer::rope_layout(std::int64_t rows) const {
  const std::int64_t p = s_.tp.size();
  RopeLayout l;
  l.rows = rows;
  l.T = s_.T;
  l.width = qkv_local();
  l.hs = s_.head_dim();
  l.q0 = 0;
  l.nq = s_.num_heads / p;
  l.k0 = q_local();
  l.nk = s_.groups() / p;
  return l;
}

AttentionShape TransformerLayer::attention_shape(std::int64_t B, std::int64_t T) const {
  const std::int64_t p = s_.tp.size();
  AttentionShape as{B, T, q_local(), s_.num_heads / p};
  as.ng = s_.groups() / p;
  return as;
}

AttentionShape TransformerLayer::cross_shape() const {
  const std::int64_t p = s_.tp.size();
  AttentionShape as{s_.B, s_.T, s_.hidden_size / p, s_.num_heads / p};
  as.Tk = s_.Tk;
  return as;
}

// res3 = res2 + dropout(cproj(attention(q(LNx(res2)), kv(enc)))), bidirectional over the
// encoder's valid positions.
void TransformerLayer::cross_forward(LayerActivations& a, TransformerScratch& s, const IntView& enc_valid) {
  const std::int64_t R = s_.local_rows(), C = s_.hidden_size;
  const bool sp = s_.tp.sequence_parallel;
  const AttentionShape as = cross_shape();
  const DropoutSpec att_spec = spec(a.rng, s_.attention_p(), kCrossProbs, true);
  record_dropout("cross_probs", index_, att_spec, {as.B, as.nh, as.T, as.Tk});
  a.enc_valid = enc_valid;
  const AttentionMask mask{false, enc_valid};
  normx_.forward(a.lnx, a.lnx_mean, a.lnx_rstd, a.res2, R);
  cq_.forward(a.cq, a.lnx, s.gathered, s.dcq);         // (BT, C/tp)
  ckv_.forward(a.ckv, a.enc, s.gathered_enc, s.dckv);  // (E, 2C/tp)
  cross_attention_probs(a.catt, a.catt_drop, a.cq, a.ckv, as, att_spec, mask, s.attention());
  cross_attention_context(a.catty, att_spec.active() ? a.catt_drop : a.catt, a.ckv, as, s.attention());
  cproj_.forward(s.branch, a.catty, false);
  const DropoutSpec cproj_spec = spec(a.rng, s_.hidden_p(), kAfterCrossProj, sp);
  record_dropout("after_cross_proj", index_, cproj_spec, {R, C});
  bias_dropout_add(a.res3, a.res2, s.branch, cproj_.bias(), R, C, cproj_spec);
}

// dres: on entry d res3, on exit d res2; the encoder output's gradient is added to denc.
void TransformerLayer::cross_backward(const FloatView& dres, LayerActivations& a, TransformerScratch& s,
                                      const FloatView& denc) {
  const std::int64_t R = s_.local_rows(), C = s_.hidden_size;
  const bool sp = s_.tp.sequence_parallel;
  const AttentionShape as = cross_shape();
  const DropoutSpec att_spec = spec(a.rng, s_.attention_p(), kCrossProbs, true);
  const AttentionMask mask{false, a.enc_valid};
  dropout_backward(s.dbranch, dres, R * C, spec(a.rng, s_.hidden_p(), kAfterCrossProj, sp), C);
  cproj_.backward(s.datty, s.dbranch, a.catty, s.dy16);
  if (!a.attention_kept) cross_attention_probs(a.catt, a.catt_drop, a.cq, a.ckv, as, att_spec, mask, s.attention());
  cross_attention_backward(s.dcq, s.dckv, s.datty, a.cq, a.ckv, a.catt, a.catt_drop, s.datt, as, att_spec, mask,
                           s.attention());
  ckv_.backward(s.denc, s.dckv, a.enc, s.gathered_enc, s.dy16);  // d enc (R_e, C), summed over TP
  accumulate(denc, s.denc, s_.enc_local_rows() * C);
  cq_.backward(s.dln, s.dcq, a.lnx, s.gathered, s.dy16);
  // dres (d res3) flows to res2 directly and through LNx: d res2 = dres + LNx'(dln)
  normx_.backward(dres, s.dln, a.res2, a.lnx_mean, a.lnx_rstd, R);
}

void TransformerLayer::backward(const FloatView& dres, const FloatView& x, LayerActivations& a, TransformerScratch& s,
                                const FloatView& denc) {
  const std::int64_t R = s_.local_rows(), C = s_.hidden_size;
  const bool sp = s_.tp.sequence_parallel;
  const AttentionShape as = attention_shape(s_.B, s_.T);
  const DropoutSpec att_spec = spec(a.rng, s_.attention_p(), kAttentionProbs, true);
  // MLP branch: out = res2 + dropout(fc2(act(fc1(ln2))))
  const DropoutSpec fc2_drop = spec(a.rng, s_.hidden_p(), kAfterFc2, sp);
  if (mlp_->fuses_branch_dropout()) {  // the device path: the dropout's backward inside fc2's
    mlp_->backward(s.dln, dres, a.ln2, *a.mlp, *s.mlp.at(mlp_->kind()), {s.gathered, s.dy16, fc2_drop});
  } else {
    dropout_backward(s.dbranch, dres, R * C, fc2_drop, C);
    mlp_->backward(s.dln, s.dbranch, a.ln2, *a.mlp, *s.mlp.at(mlp_->kind()), {s.gathered, s.dy16});  // d ln2 (R, C)
  }
  norm2_.backward(dres, s.dln, cross() ? a.res3 : a.res2, a.ln2_mean, a.ln2_rstd, R);  // dres now d(MLP input)
  if (cross()) cross_backward(dres, a, s, denc);                                       // dres now d res2
  // Attention branch: res2 = x + dropout(proj(attention(ln1)))
  const DropoutSpec proj_drop = spec(a.rng, s_.hidden_p(), kAfterProj, sp);
  // the attention's incoming gradient in 16 bits from proj's GEMM where the core takes it so
  AttentionIo io = attention_io(a, s);
  if (kDeviceKernels && proj_.input_grad_half_ok()) io.datty16 = core_->output_grad16(*a.core, core_scratch(s));
  if (kDeviceKernels && proj_.output_grad_ready_ok()) {  // the dropout's backward, proj's 16-bit dy and bias gradient
    dropout_backward_pack_half(s_.dt, s.dy16, proj_.bias_grad(), dres, R, C, proj_drop);
    proj_.backward(s.datty, dres, a.atty, s.dy16, true, io.datty16);
  } else {
    dropout_backward(s.dbranch, dres, R * C, proj_drop, C);
    proj_.backward(s.datty, s.dbranch, a.atty, s.dy16, false, io.datty16);
  }
  // the core's 16-bit input gradient straight into qkv's backward (device path, 16-bit parameters,
  // no q/k norms; rotary positions turn the 16-bit words back): no fp32 dqkv
  if (kDeviceKernels && qkv_.output_grad_ready_ok() && !qk_norm_.on()) io.dqkv16 = s.dy16;
  if (core_->backward(io, *a.core, core_scratch(s), as, att_spec)) {
    pos_->apply_backward(Act(s_.dt, s.dy16), rope_layout(s_.rows()), a.positions);
    bias_backward_half(s_.dt, qkv_.bias_grad(), s.dy16, s_.rows(), qkv_local());
    qkv_.backward(s.dln, s.dqkv, a.ln1, s.gathered, s.dy16, true);
  } else {
    pos_->apply_backward(s.dqkv, rope_layout(s_.rows()), a.positions);
    qk_norm_.backward(s.dqkv, s_.rows(), a.qk_x, a.qk_mean, a.qk_rstd, s.qk_dout, s.qk_dx);
    qkv_.backward(s.dln, s.dqkv, a.ln1, s.gathered, s.dy16);
  }
  norm1_.backward(dres, s.dln, x, a.ln1_mean, a.ln1_rstd, R);  // dres now d x
}

void TransformerLayer::infer(const FloatView& x, const FloatView& cache, const IntView& positions, std::int64_t R,
                             std::int64_t n, std::int64_t L, const AttentionShape& as, const AttentionMask& mask,
                             const InferenceScratch& w, const IntView& enc_positions) const {
  TRIDENT_REQUIRE(!cross() && s_.causal, "internal: cached inference runs causal self-attention layers");
  const std::int64_t C = s_.hidden_size;
  norm1_.forward(w.h, w.mean, w.rstd, x, R);
  TRIDENT_DEVICE_WAIT();
  qkv_.infer(w.qkv, w.h, R);  // (R, W_l)
  TRIDENT_DEVICE_WAIT();
  qk_norm_.forward(act(w.qkv), R, w.qk_x, w.qk_mean, w.qk_rstd, act(w.qk_out));
  pos_->apply(act(w.qkv), rope_layout(R), enc_positions.extent(0) > 0 ? enc_positions : positions);
  TRIDENT_DEVICE_WAIT();
  kv_cache_store(w.q, cache, w.qkv, positions, R, n, L, q_local(), kv_local());
  TRIDENT_DEVICE_WAIT();
  cross_attention_probs(w.att, Act(), w.q, cache, as, {}, mask);
  cross_attention_context(w.y, w.att, cache, as);
  TRIDENT_DEVICE_WAIT();
  proj_.infer(w.out, w.y, R);
  accumulate(x, w.out, R * C);
  norm2_.forward(w.h, w.mean, w.rstd, x, R);
  TRIDENT_DEVICE_WAIT();
  mlp_->infer(w.out, w.h, R, w.fc, w.act);
  accumulate(x, w.out, R * C);
  TRIDENT_DEVICE_WAIT();
}

}  // namespace trident
