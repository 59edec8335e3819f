// Transformer layer forward/backward.
#include "layers/transformer_layer.hpp"

#include "common/error.hpp"
#include "ops/elementwise.hpp"
#include "ops/flash_attention.hpp"
#include "ops/fused.hpp"
#include "ops/gelu.hpp"
#include "ops/mixed_precision.hpp"

#include <algorithm>

namespace trident {

namespace {
enum Site : std::uint64_t { kAttentionProbs = 1, kAfterProj = 2, kAfterFc2 = 3 };
}

std::int64_t LayerActivations::bytes() const {
  std::int64_t n = 0;
  for (const FloatView* v : {&ln1_mean, &ln1_rstd, &res2, &ln2_mean, &ln2_rstd, &out, &lse})
    n += static_cast<std::int64_t>(v->span()) * 4;
  for (const Act* v : {&ln1, &qkv, &atty, &ln2, &fc, &fc_gelu}) n += v->bytes();
  if (attention_kept) n += att.bytes() + att_drop.bytes();
  return n;
}

TransformerScratch::TransformerScratch(const TransformerShape& s, bool selective) {
  const std::int64_t BT = s.rows(), R = s.local_rows(), p = s.tp.size();
  const std::int64_t Cl = s.C / p, Fl = s.F / p, A = s.B * (s.nh / p) * s.T * s.T;
  dln = make_float("scratch::dln", R * s.C);
  dqkv = make_float("scratch::dqkv", BT * 3 * Cl);
  datty = make_float("scratch::datty", BT * Cl);
  dfc = make_float("scratch::dfc", BT * Fl);
  dfc_gelu = make_float("scratch::dfc_gelu", BT * Fl);
  dbranch = make_float("scratch::dbranch", R * s.C);
  datt = make_float("scratch::datt", A);
  branch = make_float("scratch::branch", R * s.C);
  if (s.tp.sequence_parallel) gathered = make_act(s.dt, "scratch::gathered", BT * s.C);
  if (selective) {
    att = make_act(s.dt, "scratch::att", A);
    if (s.attention_dropout > 0.f) att_drop = make_act(s.dt, "scratch::att_drop", A);
  }
  if (s.flash) delta = make_float("scratch::delta", s.B * (s.nh / p) * s.T);
  if (s.dt != DType::F32) {
    att32 = make_float("scratch::att32", A);
    dy16 = make_half("scratch::dy16", BT * std::max({3 * Cl, Fl, s.C}));
    ds16 = make_half("scratch::ds16", A);
  }
}

std::int64_t TransformerScratch::bytes() const {
  std::int64_t n = 0;
  for (const FloatView* v : {&dln, &dqkv, &datty, &dfc, &dfc_gelu, &dbranch, &datt, &branch, &att32, &delta})
    n += static_cast<std::int64_t>(v->span()) * 4;
  for (const Act* v : {&gathered, &att, &att_drop}) n += v->bytes();
  n += static_cast<std::int64_t>(dy16.span() + ds16.span()) * 2;
  return n;
}

TransformerLayer::TransformerLayer(ParamStore& store, const std::string& p, std::int64_t index,
                                   const TransformerShape& s)
    : s_(s),
      index_(index),
      norm1_(store, p + "/input_layernorm", s.C, s.ln_eps),
      norm2_(store, p + "/post_attention_layernorm", s.C, s.ln_eps),
      qkv_(store, p + "/self_attention/qkv", s.C, 3 * s.C, s.init_std, s.tp, s.rows(), 3),
      fc1_(store, p + "/mlp/fc1", s.C, s.F, s.init_std, s.tp, s.rows()),
      proj_(store, p + "/self_attention/proj", s.C, s.C, s.out_init_std, s.tp, s.rows()),
      fc2_(store, p + "/mlp/fc2", s.F, s.C, s.out_init_std, s.tp, s.rows()) {
  const std::int64_t tp = s.tp.size();
  TRIDENT_REQUIRE(s.nh % tp == 0, "model.num_heads (" << s.nh << ") is not divisible by parallel.tp (" << tp << ")");
  TRIDENT_REQUIRE(s.F % tp == 0, "model.ffn_hidden_size (" << s.F << ") is not divisible by parallel.tp (" << tp << ")");
  TRIDENT_REQUIRE(!s.tp.sequence_parallel || s.rows() % tp == 0,
                  "sequence parallelism splits micro_batch_size x seq_length = " << s.rows()
                                                                                   << " tokens over tp = " << tp
                                                                                   << ": not divisible");
}

LayerActivations TransformerLayer::make_activations(const TransformerScratch& scratch, bool keep_attention) const {
  const TransformerShape& s = s_;
  const DType dt = s.dt;
  const std::int64_t tp = s.tp.size();
  const std::int64_t BT = s.rows(), R = s.local_rows(), C = s.C, Cl = C / tp, Fl = s.F / tp, nhl = s.nh / tp;
  LayerActivations a;
  a.ln1 = make_act(dt, "layer::ln1", R * C);
  a.ln1_mean = make_float("layer::ln1_mean", R);
  a.ln1_rstd = make_float("layer::ln1_rstd", R);
  a.qkv = make_act(dt, "layer::qkv", BT * 3 * Cl);
  a.attention_kept = keep_attention;
  if (s.flash) {  // the fused kernel keeps only the per-row log-sum-exp
    a.attention_kept = true;
    a.lse = make_float("layer::lse", s.B * nhl * s.T);
  } else if (keep_attention) {
    a.att = make_act(dt, "layer::att", s.B * nhl * s.T * s.T);
    if (s.attention_dropout > 0.f) a.att_drop = make_act(dt, "layer::att_drop", s.B * nhl * s.T * s.T);
  } else {
    TRIDENT_REQUIRE(scratch.att.size() > 0, "internal: selective recomputation needs the attention workspace");
    a.att = scratch.att;
    a.att_drop = scratch.att_drop;
  }
  a.atty = make_act(dt, "layer::atty", BT * Cl);
  a.res2 = make_float("layer::res2", R * C);
  a.ln2 = make_act(dt, "layer::ln2", R * C);
  a.ln2_mean = make_float("layer::ln2_mean", R);
  a.ln2_rstd = make_float("layer::ln2_rstd", R);
  a.fc = make_act(dt, "layer::fc", BT * Fl);
  a.fc_gelu = make_act(dt, "layer::fc_gelu", BT * Fl);
  a.out = make_float("layer::out", R * C);
  return a;
}

DropoutSpec TransformerLayer::spec(const DropoutStreams& rng, float p, std::uint64_t site, bool tp_region) const {
  DropoutSpec d;
  if (!rng.training || p <= 0.f) return d;
  d.p = p;
  d.key = dropout_key(tp_region ? rng.tp_local : rng.shared, rng.step, static_cast<std::uint64_t>(index_), site);
  return d;
}

void TransformerLayer::forward(const FloatView& x, const DropoutStreams& rng, LayerActivations& a,
                               TransformerScratch& s, const IntView& key_valid) {
  a.rng = rng;
  a.mask = AttentionMask{s_.causal, key_valid};
  const std::int64_t R = s_.local_rows(), C = s_.C, p = s_.tp.size();
  const bool sp = s_.tp.sequence_parallel, half = s_.dt != DType::F32;
  const AttentionShape as{s_.B, s_.T, C / p, s_.nh / p};
  const DropoutSpec att_spec = spec(rng, s_.attention_dropout, kAttentionProbs, true);
  norm1_.forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, R);
  Kokkos::fence();
  qkv_.forward(a.qkv, a.ln1, s.gathered, s.dqkv);  // (BT, 3C/tp)
  if (s_.flash) {
    flash_attention_forward(a.atty, a.lse, a.qkv, as, att_spec, a.mask);
  } else if (half) {
    attention_probs_half(s_.dt, a.att.h, a.att_drop.h, a.qkv.h, s.datt, as, att_spec, a.mask);
    attention_context_half(s_.dt, a.atty.h, s.datty, att_spec.active() ? a.att_drop.h : a.att.h, a.qkv.h, as);
  } else {
    attention_probs(a.att.f, a.att_drop.f, a.qkv.f, as, att_spec, a.mask);
    attention_context(a.atty.f, att_spec.active() ? a.att_drop.f : a.att.f, a.qkv.f, as);  // (BT, C/tp)
  }
  Kokkos::fence();
  proj_.forward(s.branch, a.atty, false);  // (R, C), bias left to the fused kernel
  bias_dropout_add(a.res2, x, s.branch, proj_.bias(), R, C, spec(rng, s_.hidden_dropout, kAfterProj, sp));
  norm2_.forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, R);
  Kokkos::fence();
  fc1_.forward(a.fc, a.ln2, s.gathered, s.dfc, false);  // (BT, F/tp) before its bias
  bias_gelu_forward(a.fc, a.fc_gelu, half ? s.dfc : a.fc.f, fc1_.bias(), s_.rows(), s_.F / p);
  Kokkos::fence();
  fc2_.forward(s.branch, a.fc_gelu, false);  // (R, C)
  bias_dropout_add(a.out, a.res2, s.branch, fc2_.bias(), R, C, spec(rng, s_.hidden_dropout, kAfterFc2, sp));
  Kokkos::fence();
}

void TransformerLayer::backward(const FloatView& dres, const FloatView& x, LayerActivations& a,
                                TransformerScratch& s) {
  const std::int64_t R = s_.local_rows(), C = s_.C, p = s_.tp.size(), nF = s_.rows() * (s_.F / p);
  const bool sp = s_.tp.sequence_parallel, half = s_.dt != DType::F32;
  const AttentionShape as{s_.B, s_.T, C / p, s_.nh / p};
  const DropoutSpec att_spec = spec(a.rng, s_.attention_dropout, kAttentionProbs, true);
  // MLP branch: out = res2 + dropout(fc2(gelu(fc1(ln2))))
  dropout_backward(s.dbranch, dres, R * C, spec(a.rng, s_.hidden_dropout, kAfterFc2, sp));
  Kokkos::fence();
  fc2_.backward(s.dfc_gelu, s.dbranch, a.fc_gelu, s.dy16);  // d gelu-out (BT, F/tp)
  if (half)
    gelu_backward_half(s_.dt, s.dfc, s.dfc_gelu, a.fc.h, nF);
  else
    gelu_backward(s.dfc, s.dfc_gelu, a.fc.f, nF);
  Kokkos::fence();
  fc1_.backward(s.dln, s.dfc, a.ln2, s.gathered, s.dy16);  // d ln2 (R, C)
  Kokkos::fence();
  norm2_.backward(dres, s.dln, a.res2, a.ln2_mean, a.ln2_rstd, R);  // dres now d res2
  // Attention branch: res2 = x + dropout(proj(attention(ln1)))
  dropout_backward(s.dbranch, dres, R * C, spec(a.rng, s_.hidden_dropout, kAfterProj, sp));
  Kokkos::fence();
  proj_.backward(s.datty, s.dbranch, a.atty, s.dy16);
  // selective recomputation: the probabilities (and their dropout) again from the kept qkv
  if (s_.flash) {
    flash_attention_backward(s.dqkv, s.datty, a.qkv, a.atty, a.lse, s.delta, as, att_spec, a.mask);
  } else if (half) {
    if (!a.attention_kept) attention_probs_half(s_.dt, a.att.h, a.att_drop.h, a.qkv.h, s.datt, as, att_spec, a.mask);
    attention_backward_half(s_.dt, s.dqkv, s.datty, a.qkv.h, a.att.h, a.att_drop.h, s.datt, s.att32, s.dy16, s.ds16,
                            as, att_spec, a.mask);
  } else {
    if (!a.attention_kept) attention_probs(a.att.f, a.att_drop.f, a.qkv.f, as, att_spec, a.mask);
    attention_backward(s.dqkv, s.datty, a.qkv.f, a.att.f, s.datt, as, att_spec, a.att_drop.f, a.mask);
  }
  Kokkos::fence();
  qkv_.backward(s.dln, s.dqkv, a.ln1, s.gathered, s.dy16);
  Kokkos::fence();
  norm1_.backward(dres, s.dln, x, a.ln1_mean, a.ln1_rstd, R);  // dres now d x
}

}  // namespace trident
