// Transformer layer forward/backward.
#include "layers/transformer_layer.hpp"

#include "common/error.hpp"
#include "ops/elementwise.hpp"
#include "ops/gelu.hpp"

namespace trident {

namespace {
enum Site : std::uint64_t { kAttentionProbs = 1, kAfterProj = 2, kAfterFc2 = 3 };
}

TransformerScratch::TransformerScratch(const TransformerShape& s) {
  const std::int64_t BT = s.rows(), R = s.local_rows(), p = s.tp.size();
  const std::int64_t Cl = s.C / p, Fl = s.F / p;
  dln = make_float("scratch::dln", R * s.C);
  dqkv = make_float("scratch::dqkv", BT * 3 * Cl);
  datty = make_float("scratch::datty", BT * Cl);
  dfc = make_float("scratch::dfc", BT * Fl);
  dfc_gelu = make_float("scratch::dfc_gelu", BT * Fl);
  dbranch = make_float("scratch::dbranch", R * s.C);
  datt = make_float("scratch::datt", s.B * (s.nh / p) * s.T * s.T);
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
  const std::int64_t BT = s.rows(), R = s.local_rows(), C = s.C, Cl = C / tp, Fl = s.F / tp, nhl = s.nh / tp;
  ln1_ = make_float("layer::ln1", R * C);
  ln1_mean_ = make_float("layer::ln1_mean", R);
  ln1_rstd_ = make_float("layer::ln1_rstd", R);
  qkv_act_ = make_float("layer::qkv", BT * 3 * Cl);
  att_ = make_float("layer::att", s.B * nhl * s.T * s.T);
  if (s.attention_dropout > 0.f) att_drop_ = make_float("layer::att_drop", s.B * nhl * s.T * s.T);
  atty_ = make_float("layer::atty", BT * Cl);
  attproj_ = make_float("layer::attproj", R * C);
  res2_ = make_float("layer::res2", R * C);
  ln2_ = make_float("layer::ln2", R * C);
  ln2_mean_ = make_float("layer::ln2_mean", R);
  ln2_rstd_ = make_float("layer::ln2_rstd", R);
  fc_ = make_float("layer::fc", BT * Fl);
  fc_gelu_ = make_float("layer::fc_gelu", BT * Fl);
  fcproj_ = make_float("layer::fcproj", R * C);
  out_ = make_float("layer::out", R * C);
}

DropoutSpec TransformerLayer::spec(float p, std::uint64_t site, bool tp_region) const {
  DropoutSpec d;
  if (!rng_.training || p <= 0.f) return d;
  d.p = p;
  d.key = dropout_key(tp_region ? rng_.tp_local : rng_.shared, rng_.step, static_cast<std::uint64_t>(index_), site);
  return d;
}

void TransformerLayer::forward(const FloatView& x, const DropoutStreams& rng) {
  rng_ = rng;
  const std::int64_t R = s_.local_rows(), C = s_.C, p = s_.tp.size();
  const bool sp = s_.tp.sequence_parallel;
  const AttentionShape as{s_.B, s_.T, C / p, s_.nh / p};
  norm1_.forward(ln1_, ln1_mean_, ln1_rstd_, x, R);
  Kokkos::fence();
  qkv_.forward(qkv_act_, ln1_);  // (BT, 3C/tp)
  attention_forward(atty_, qkv_act_, att_, as, spec(s_.attention_dropout, kAttentionProbs, true),
                    att_drop_);  // (BT, C/tp)
  Kokkos::fence();
  proj_.forward(attproj_, atty_);  // (R, C)
  dropout_forward(attproj_, attproj_, R * C, spec(s_.hidden_dropout, kAfterProj, sp));
  add(res2_, x, attproj_, R * C);
  norm2_.forward(ln2_, ln2_mean_, ln2_rstd_, res2_, R);
  Kokkos::fence();
  fc1_.forward(fc_, ln2_);  // (BT, F/tp)
  gelu_forward(fc_gelu_, fc_, s_.rows() * (s_.F / p));
  Kokkos::fence();
  fc2_.forward(fcproj_, fc_gelu_);  // (R, C)
  dropout_forward(fcproj_, fcproj_, R * C, spec(s_.hidden_dropout, kAfterFc2, sp));
  add(out_, res2_, fcproj_, R * C);
}

void TransformerLayer::backward(const FloatView& dres, const FloatView& x, TransformerScratch& s) {
  const std::int64_t R = s_.local_rows(), C = s_.C, p = s_.tp.size();
  const bool sp = s_.tp.sequence_parallel;
  const AttentionShape as{s_.B, s_.T, C / p, s_.nh / p};
  // MLP branch: out = res2 + dropout(fc2(gelu(fc1(ln2))))
  dropout_backward(s.dbranch, dres, R * C, spec(s_.hidden_dropout, kAfterFc2, sp));
  Kokkos::fence();
  fc2_.backward(s.dfc_gelu, s.dbranch, fc_gelu_);  // d gelu-out (BT, F/tp)
  gelu_backward(s.dfc, s.dfc_gelu, fc_, s_.rows() * (s_.F / p));
  Kokkos::fence();
  fc1_.backward(s.dln, s.dfc, ln2_);  // d ln2 (R, C)
  Kokkos::fence();
  norm2_.backward(dres, s.dln, res2_, ln2_mean_, ln2_rstd_, R);  // dres now d res2
  // Attention branch: res2 = x + dropout(proj(attention(ln1)))
  dropout_backward(s.dbranch, dres, R * C, spec(s_.hidden_dropout, kAfterProj, sp));
  Kokkos::fence();
  proj_.backward(s.datty, s.dbranch, atty_);
  attention_backward(s.dqkv, s.datty, qkv_act_, att_, s.datt, as, spec(s_.attention_dropout, kAttentionProbs, true),
                     att_drop_);
  Kokkos::fence();
  qkv_.backward(s.dln, s.dqkv, ln1_);
  Kokkos::fence();
  norm1_.backward(dres, s.dln, x, ln1_mean_, ln1_rstd_, R);  // dres now d x
}

}  // namespace trident
