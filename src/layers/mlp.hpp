// The MLP slot of the one transformer layer (docs/DESIGN.md "Layer spec"): the branch
//   branch = MLP(in),  in = the second norm's output (R, C),  out = residual + dropout(branch + bias)
// filled by a module the architecture names (ModelArch::mlp_module()):
//   dense  fc1 (column-parallel) -> the MLP activation slot (GELU, SwiGLU) -> fc2 (row-parallel)
// A module declares its parameters in two phases, its input side when built (after the
// attention's qkv) and its output side in declare_output (after the attention's proj), which is
// the order of the flat parameter buffer every earlier run used. It keeps what its backward pass
// needs in an MlpKept of its own (one per layer and micro-batch in flight, owned by the layer's
// activations) and shares an MlpScratch (one per model chunk, sized for one layer).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "layers/layer_modules.hpp"
#include "layers/parallel_linear.hpp"
#include "ops/dropout.hpp"

namespace trident {

struct TransformerShape;

// What one layer's MLP keeps from its forward pass (the module's own type).
struct MlpKept {
  virtual ~MlpKept() = default;
  virtual std::int64_t bytes() const = 0;
};
// Backward temporaries shared by the layers of a chunk (the module's own type).
struct MlpScratch {
  virtual ~MlpScratch() = default;
  virtual std::int64_t bytes() const = 0;
};
// Workspaces of the layer's scratch an MLP may use: the sequence-parallel all-gather buffer
// (BT, C) and the 16-bit gradient copy for GEMMs.
struct MlpWork {
  Act gathered;
  HalfView dy16;
  // backward, where the module fuses_branch_dropout(): dbranch is the gradient at the branch's
  // output before this dropout's backward, which the module applies
  DropoutSpec branch_drop;
};

class MlpModule {
 public:
  virtual ~MlpModule() = default;
  // the module's name; the modules of one kind in a chunk share one scratch
  virtual const char* kind() const = 0;
  // the output side's parameters (see above)
  virtual void declare_output(ParamStore& store) = 0;
  virtual std::shared_ptr<MlpKept> make_kept() const = 0;
  virtual std::shared_ptr<MlpScratch> make_scratch() const = 0;
  // branch (R, C) fp32 = MLP(in) without the output bias (left to the fused bias + dropout +
  // residual add: output_bias()); in (R, C) in the activations' type must stay alive until the
  // backward pass.
  virtual void forward(const FloatView& branch, const Act& in, MlpKept& k, MlpScratch& s, const MlpWork& w) = 0;
  virtual Act output_bias() const = 0;
  // din (R, C) fp32 (overwritten) = d MLP / d in given dbranch (R, C).
  virtual void backward(const FloatView& din, const FloatView& dbranch, const Act& in, MlpKept& k, MlpScratch& s,
                        const MlpWork& w) = 0;
  // Whether backward applies the branch's dropout itself (MlpWork::branch_drop): the device path's
  // dense MLP, whose fc2 takes the dropout's backward in the pass that rounds its output gradient.
  virtual bool fuses_branch_dropout() const { return false; }
  // Inference (fp32, no sequence parallelism): out (R, C) = MLP(in) with the output bias; fc and
  // act are workspaces of mlp_infer_floats(s, R) floats each.
  virtual void infer(const FloatView& out, const FloatView& in, std::int64_t R, const FloatView& fc,
                     const FloatView& act) const = 0;
};

// The module the shape's architecture names for global layer `layer` (dense, or moe where
// s.moe.layer(layer)), its input side's parameters declared under `prefix` (".../mlp").
std::unique_ptr<MlpModule> make_mlp(ParamStore& store, const std::string& prefix, const TransformerShape& s,
                                    std::int64_t layer);
// The floats of each inference workspace of infer() for R rows.
std::int64_t mlp_infer_floats(const ModelArch& arch, std::int64_t tp, std::int64_t R);
// The widest row of a 16-bit gradient copy the modules' GEMMs take from the layer's MlpWork::dy16
// (the dense MLP's fc1 and a shared expert's; the experts' rows have their own).
std::int64_t mlp_dy16_width(const TransformerShape& s);

}  // namespace trident
