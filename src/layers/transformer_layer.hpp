// Pre-LayerNorm transformer layer (GPT-2), tensor- and sequence-parallel (Megatron):
//   x2 = x + dropout(proj(attention(LN1(x))))      x3 = x2 + dropout(fc2(gelu(fc1(LN2(x2)))))
// qkv and fc1 are column-parallel, proj and fc2 row-parallel; this rank computes heads
// [r*nh/tp, (r+1)*nh/tp). Outside the tensor-parallel region (LayerNorm, dropout, residual) a
// rank holds all B*T rows, or rows/tp of them with sequence parallelism.
// Keeps, per instance, the activations its backward needs (no autograd tape).
#pragma once
#include <string>
#include <deque>

#include "layers/layer_norm.hpp"
#include "layers/parallel_linear.hpp"
#include "ops/attention.hpp"

namespace trident {

struct TransformerShape {
  std::int64_t B, T, C, nh, F;  // micro-batch, sequence, hidden, heads, ffn hidden (global sizes)
  float ln_eps, init_std, out_init_std;  // out_init_std: std of the output projections
  TensorParallel tp;
  float hidden_dropout = 0.f, attention_dropout = 0.f;
  std::int64_t rows() const { return B * T; }
  std::int64_t local_rows() const { return tp.sequence_parallel ? B * T / tp.size() : B * T; }
};

// Dropout streams of one micro-batch (Megatron's convention: `shared` is the same on every TP
// rank and serves regions where TP ranks hold identical data; `tp_local` differs per TP rank
// and serves the tensor-parallel region and, with sequence parallelism, the row-split region).
struct DropoutStreams {
  std::uint64_t step = 0;
  std::uint64_t shared = 0, tp_local = 0;
  bool training = false;  // no dropout when false (evaluation)
};

// Scratch shared by all layers during backward (sized for one layer).
struct TransformerScratch {
  explicit TransformerScratch(const TransformerShape& s);
  FloatView dln, dqkv, datty, dfc, dfc_gelu, dbranch;  // (R,C) (BT,3C/tp) (BT,C/tp) (BT,F/tp) x2 (R,C)
  FloatView datt;                                      // attention scratch (B, nh/tp, T, T)
};

class TransformerLayer {
 public:
  TransformerLayer(ParamStore& store, const std::string& prefix, std::int64_t index, const TransformerShape& s);

  // Activations are kept per slot: one set for each micro-batch in flight (pipeline schedules
  // run several forwards before their backwards). Slots are allocated on first use.
  // x (R, C) -> out(slot) (R, C). x must stay alive until the slot's backward.
  void forward(const FloatView& x, const DropoutStreams& rng, int slot = 0);
  // dres (R, C): on entry the gradient w.r.t. this layer's output, on exit w.r.t. its input x.
  void backward(const FloatView& dres, const FloatView& x, TransformerScratch& s, int slot = 0);

  const FloatView& out(int slot = 0) const { return acts_.at(slot).out; }

 private:
  // Everything one micro-batch's backward needs; R = local rows, BT = all rows,
  // C_l = C/tp, F_l = F/tp.
  struct Activations {
    DropoutStreams rng;
    FloatView ln1, ln1_mean, ln1_rstd, ln1_gathered, qkv, att, att_drop, atty, attproj, res2;
    FloatView ln2, ln2_mean, ln2_rstd, ln2_gathered, fc, fc_gelu, fcproj, out;
  };
  Activations& slot(int i);
  DropoutSpec spec(const Activations& a, float p, std::uint64_t site, bool tp_region) const;

  TransformerShape s_;
  std::int64_t index_;
  LayerNorm norm1_, norm2_;
  ColumnParallelLinear qkv_, fc1_;
  RowParallelLinear proj_, fc2_;
  std::deque<Activations> acts_;  // deque: references to a slot stay valid as slots are added
};

}  // namespace trident
