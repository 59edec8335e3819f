// Transformer layer forward/backward.
#include "layers/transformer_layer.hpp"

#include "ops/elementwise.hpp"
#include "ops/gelu.hpp"

namespace trident {

TransformerScratch::TransformerScratch(const TransformerShape& s) {
  const std::int64_t BT = s.B * s.T;
  dln = make_float("scratch::dln", BT * s.C);
  dqkv = make_float("scratch::dqkv", BT * 3 * s.C);
  datty = make_float("scratch::datty", BT * s.C);
  dfc = make_float("scratch::dfc", BT * s.F);
  dfc_gelu = make_float("scratch::dfc_gelu", BT * s.F);
  dyperm = make_float("scratch::dyperm", BT * s.C);
  datt = make_float("scratch::datt", s.B * s.nh * s.T * s.T);
  dq = make_float("scratch::dq", BT * s.C);
  dk = make_float("scratch::dk", BT * s.C);
  dv = make_float("scratch::dv", BT * s.C);
}

TransformerLayer::TransformerLayer(ParamStore& store, const std::string& p, const TransformerShape& s)
    : s_(s),
      norm1_(store, p + "/input_layernorm", s.C, s.ln_eps),
      norm2_(store, p + "/post_attention_layernorm", s.C, s.ln_eps),
      qkv_(store, p + "/self_attention/qkv", s.C, 3 * s.C, s.init_std),
      proj_(store, p + "/self_attention/proj", s.C, s.C, s.out_init_std),
      fc1_(store, p + "/mlp/fc1", s.C, s.F, s.init_std),
      fc2_(store, p + "/mlp/fc2", s.F, s.C, s.out_init_std) {
  const std::int64_t BT = s.B * s.T, C = s.C;
  ln1_ = make_float("layer::ln1", BT * C);
  ln1_mean_ = make_float("layer::ln1_mean", BT);
  ln1_rstd_ = make_float("layer::ln1_rstd", BT);
  qkv_act_ = make_float("layer::qkv", BT * 3 * C);
  q_ = make_float("layer::q", BT * C);
  k_ = make_float("layer::k", BT * C);
  v_ = make_float("layer::v", BT * C);
  att_ = make_float("layer::att", s.B * s.nh * s.T * s.T);
  yperm_ = make_float("layer::yperm", BT * C);
  atty_ = make_float("layer::atty", BT * C);
  attproj_ = make_float("layer::attproj", BT * C);
  res2_ = make_float("layer::res2", BT * C);
  ln2_ = make_float("layer::ln2", BT * C);
  ln2_mean_ = make_float("layer::ln2_mean", BT);
  ln2_rstd_ = make_float("layer::ln2_rstd", BT);
  fc_ = make_float("layer::fc", BT * s.F);
  fc_gelu_ = make_float("layer::fc_gelu", BT * s.F);
  fcproj_ = make_float("layer::fcproj", BT * C);
  out_ = make_float("layer::out", BT * C);
}

void TransformerLayer::forward(const FloatView& x) {
  const std::int64_t BT = s_.B * s_.T, C = s_.C;
  const AttentionShape as{s_.B, s_.T, C, s_.nh};
  norm1_.forward(ln1_, ln1_mean_, ln1_rstd_, x, BT);
  Kokkos::fence();
  qkv_.forward(qkv_act_, ln1_, BT);                       // (BT, 3C)
  attention_forward(atty_, q_, k_, v_, att_, yperm_, qkv_act_, as);  // (BT, C)
  Kokkos::fence();
  proj_.forward(attproj_, atty_, BT);                     // (BT, C)
  add(res2_, x, attproj_, BT * C);
  norm2_.forward(ln2_, ln2_mean_, ln2_rstd_, res2_, BT);
  Kokkos::fence();
  fc1_.forward(fc_, ln2_, BT);                            // (BT, F)
  gelu_forward(fc_gelu_, fc_, BT * s_.F);
  Kokkos::fence();
  fc2_.forward(fcproj_, fc_gelu_, BT);                    // (BT, C)
  add(out_, res2_, fcproj_, BT * C);
}

void TransformerLayer::backward(const FloatView& dres, const FloatView& x, TransformerScratch& s) {
  const std::int64_t BT = s_.B * s_.T;
  const AttentionShape as{s_.B, s_.T, s_.C, s_.nh};
  // MLP branch: out = res2 + fc2(gelu(fc1(ln2)))
  fc2_.backward(s.dfc_gelu, dres, fc_gelu_, BT);          // d gelu-out (BT, F)
  gelu_backward(s.dfc, s.dfc_gelu, fc_, BT * s_.F);       // d fc-out
  Kokkos::fence();
  fc1_.backward(s.dln, s.dfc, ln2_, BT);                  // d ln2 (BT, C)
  Kokkos::fence();
  norm2_.backward(dres, s.dln, res2_, ln2_mean_, ln2_rstd_, BT);  // dres now d res2
  // Attention branch: res2 = x + proj(attention(ln1))
  Kokkos::fence();
  proj_.backward(s.datty, dres, atty_, BT);
  attention_backward(s.dqkv, s.datty, q_, k_, v_, att_, s.dyperm, s.datt, s.dq, s.dk, s.dv, as);
  Kokkos::fence();
  qkv_.backward(s.dln, s.dqkv, ln1_, BT);
  Kokkos::fence();
  norm1_.backward(dres, s.dln, x, ln1_mean_, ln1_rstd_, BT);  // dres now d x
}

}  // namespace trident
