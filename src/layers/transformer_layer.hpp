// Pre-LayerNorm transformer layer (GPT-2):
//   x2 = x + proj(attention(LN1(x)))      x3 = x2 + fc2(gelu(fc1(LN2(x2))))
// Keeps, per instance, the activations its backward needs (no autograd tape).
#pragma once
#include <string>

#include "layers/layer_norm.hpp"
#include "layers/linear.hpp"
#include "ops/attention.hpp"

namespace trident {

struct TransformerShape {
  std::int64_t B, T, C, nh, F;  // micro-batch, sequence, hidden, heads, ffn hidden
  float ln_eps, init_std, out_init_std;  // out_init_std: std of the output projections
  bool causal = true;
};

// Scratch shared by all layers during backward (sized for one layer).
struct TransformerScratch {
  explicit TransformerScratch(const TransformerShape& s);
  FloatView dln, dqkv, datty, dfc, dfc_gelu;             // (BT,C) (BT,3C) (BT,C) (BT,F) (BT,F)
  FloatView dyperm, datt, dq, dk, dv;                    // attention scratch
};

class TransformerLayer {
 public:
  TransformerLayer(ParamStore& store, const std::string& prefix, const TransformerShape& s);

  // x (BT, C) -> out() (BT, C). x must stay alive until backward.
  void forward(const FloatView& x);
  // dres (BT, C): on entry the gradient w.r.t. this layer's output, on exit w.r.t. its input x.
  void backward(const FloatView& dres, const FloatView& x, TransformerScratch& s);

  const FloatView& out() const { return out_; }

 private:
  TransformerShape s_;
  LayerNorm norm1_, norm2_;
  Linear qkv_, proj_, fc1_, fc2_;
  // activations (BT = B*T rows)
  FloatView ln1_, ln1_mean_, ln1_rstd_, qkv_act_, q_, k_, v_, att_, yperm_, atty_, attproj_, res2_;
  FloatView ln2_, ln2_mean_, ln2_rstd_, fc_, fc_gelu_, fcproj_, out_;
};

}  // namespace trident
