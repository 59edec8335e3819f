// LayerNorm layer: the weight and bias (C) of one LayerNorm in the parameter store (weight 1 and
// bias 0 at init, no weight decay, replicated over tensor-parallel ranks), applied by
// ops/layernorm over the last dimension of (N, C) rows with fp32 statistics; with 16-bit
// parameters the output is 16-bit words (docs/DESIGN.md "Mixed precision").
#pragma once
#include <string>

#include "layers/layer_modules.hpp"
#include "layers/param_store.hpp"

namespace trident {

// The normalisation slot's "LayerNorm" module.
class LayerNorm final : public NormModule {
 public:
  LayerNorm() = default;
  LayerNorm(ParamStore& store, const std::string& name, std::int64_t C, float eps);
  // x (N, C) fp32 -> out (N, C): fp32, or 16-bit words with 16-bit parameters (statistics and
  // arithmetic stay fp32).
  void forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, std::int64_t N,
               const ResidualAdd& pre = {}) const override;
  void forward(const FloatView& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
               std::int64_t N) const {
    forward(act(out), mean, rstd, x, N);
  }
  // dx += d/dx ; parameter grads accumulated
  void backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView& mean,
                const FloatView& rstd, std::int64_t N) const override;

 private:
  ParamStore* store_ = nullptr;
  ParamId w_ = -1, b_ = -1;
  std::int64_t C_ = 0;
  float eps_ = 1e-5f;
};

}  // namespace trident
