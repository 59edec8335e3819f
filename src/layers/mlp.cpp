// The MLP slot's modules (mlp.hpp) and its registry.
#include "layers/mlp.hpp"

#include <algorithm>

#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "layers/moe_mlp.hpp"
#include "layers/transformer_layer.hpp"
#include "ops/fused.hpp"

namespace trident {

namespace {

// The dense MLP: fc2(act(fc1(in))), fc1 column-parallel with blocks() row blocks (SwiGLU: gate |
// up), fc2 row-parallel; a rank computes F/tp of the hidden units.
struct DenseKept final : MlpKept {
  Act fc, fc_act;  // (BT, blocks F/tp): fc1's output with its bias (the activation's input), (BT, F/tp)
  std::int64_t bytes() const override { return fc.bytes() + fc_act.bytes(); }
};
struct DenseScratch final : MlpScratch {
  // d fc1-out (BT, blocks F/tp), also the fp32 GEMM output of the 16-bit forward pass; d act-out (BT, F/tp)
  FloatView dfc, dfc_act;
  std::int64_t bytes() const override { return static_cast<std::int64_t>(dfc.span() + dfc_act.span()) * 4; }
};

std::shared_ptr<MlpScratch> dense_scratch(const TransformerShape& s) {
  auto d = std::make_shared<DenseScratch>();
  const std::int64_t Fl = s.ffn_hidden_size / s.tp.size(), BT = s.rows();
  d->dfc = make_float("scratch::dfc", BT * Fl * make_mlp_activation(s)->blocks());
  d->dfc_act = make_float("scratch::dfc_act", BT * Fl);
  return d;
}

class DenseMlp final : public MlpModule {
 public:
  DenseMlp(ParamStore& store, const std::string& prefix, const TransformerShape& s)
      : s_(s), prefix_(prefix), act_(make_mlp_activation(s)),
        fc1_(store, prefix + "/fc1", s.hidden_size, act_->blocks() * s.ffn_hidden_size, s.init_std(), s.tp, s.rows(),
             act_->blocks(), s.lora_for("fc1"), s.add_bias_linear) {}
  void declare_output(ParamStore& store) override {
    fc2_ = RowParallelLinear(store, prefix_ + "/fc2", s_.ffn_hidden_size, s_.hidden_size, s_.out_init_std, s_.tp,
                             s_.rows(), s_.lora_for("fc2"), s_.add_bias_linear);
  }
  std::shared_ptr<MlpKept> make_kept() const override {
    auto k = std::make_shared<DenseKept>();
    const std::int64_t BT = s_.rows(), Fl = s_.ffn_hidden_size / s_.tp.size();
    k->fc = make_act(s_.dt, "layer::fc", BT * Fl * act_->blocks());
    k->fc_act = make_act(s_.dt, "layer::fc_act", BT * Fl);
    return k;
  }
  const char* kind() const override { return "dense"; }
  std::shared_ptr<MlpScratch> make_scratch() const override { return dense_scratch(s_); }
  void forward(const FloatView& branch, const Act& in, MlpKept& kept, MlpScratch& scratch, const MlpWork& w) override {
    auto& k = static_cast<DenseKept&>(kept);
    auto& s = static_cast<DenseScratch&>(scratch);
    const bool half = s_.dt != DType::F32;
    if (half && act_->gelu_in_gemm() && fc1_.gelu_epilogue()) {  // bias and GELU in the GEMM (device)
      fc1_.forward_gelu(k.fc, k.fc_act, in, w.gathered);
    } else {
      fc1_.forward(k.fc, in, w.gathered, s.dfc, false);  // (BT, F/tp) before its bias
      act_->forward(k.fc, k.fc_act, half ? s.dfc : k.fc.f, fc1_.bias(), s_.rows(), s_.ffn_hidden_size / s_.tp.size());
    }
    fc2_.forward(branch, k.fc_act, false);  // (R, C)
  }
  Act output_bias() const override { return fc2_.bias(); }
  bool fuses_branch_dropout() const override { return kDeviceKernels && fc2_.output_grad_ready_ok(); }
  void backward(const FloatView& din, const FloatView& dbranch, const Act& in, MlpKept& kept, MlpScratch& scratch,
                const MlpWork& w) override {
    auto& k = static_cast<DenseKept&>(kept);
    auto& s = static_cast<DenseScratch&>(scratch);
    if (fuses_branch_dropout()) {  // the branch's dropout backward, fc2's 16-bit dy and bias gradient at once
      dropout_backward_pack_half(s_.dt, w.dy16, fc2_.bias_grad(), dbranch, s_.local_rows(), s_.hidden_size,
                                 w.branch_drop);
      fc2_.backward(s.dfc_act, dbranch, k.fc_act, w.dy16, true);
    } else {
      fc2_.backward(s.dfc_act, dbranch, k.fc_act, w.dy16);  // d act-out (BT, F/tp)
    }
    const std::int64_t rows = s_.rows(), F = s_.ffn_hidden_size / s_.tp.size();
    // device path: the activation's backward writes fc1's 16-bit output gradient (and its bias
    // gradient) in one pass
    if (kDeviceKernels && fc1_.output_grad_ready_ok() &&
        act_->backward_half(w.dy16, fc1_.bias_grad(), s.dfc_act, k.fc, rows, F)) {
      fc1_.backward(din, s.dfc, in, w.gathered, w.dy16, true);
      return;
    }
    act_->backward(s.dfc, s.dfc_act, k.fc, rows, F);
    fc1_.backward(din, s.dfc, in, w.gathered, w.dy16);  // d in (R, C)
  }
  void infer(const FloatView& out, const FloatView& in, std::int64_t R, const FloatView& fc,
             const FloatView& act) const override {
    fc1_.infer(fc, in, R);
    act_->infer(act, fc, R, s_.ffn_hidden_size / s_.tp.size());
    fc2_.infer(out, act, R);
  }

 private:
  TransformerShape s_;
  std::string prefix_;
  std::shared_ptr<const MlpActivation> act_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

}  // namespace

std::unique_ptr<MlpModule> make_mlp(ParamStore& store, const std::string& prefix, const TransformerShape& s,
                                    std::int64_t layer) {
  if (s.moe.layer(layer)) return make_moe_mlp(store, prefix, s, layer);
  return std::make_unique<DenseMlp>(store, prefix, s);
}

std::int64_t mlp_dy16_width(const TransformerShape& s) {
  const std::int64_t F = std::max(s.ffn_hidden_size, s.moe.shared_expert_intermediate_size);
  return F / s.tp.size() * make_mlp_activation(s)->blocks();  // fc1's columns on this rank
}

std::int64_t mlp_infer_floats(const ModelArch& arch, std::int64_t tp, std::int64_t R) {
  const std::int64_t F = std::max(arch.ffn_hidden_size, arch.moe.shared_expert_intermediate_size);
  return R * F / tp * make_mlp_activation(arch)->blocks();  // the dense MLP's or a shared expert's
}

}  // namespace trident
