// The normalisation slot's "RMSNorm" module: the weight (C) of one RMSNorm in the parameter store
// (init 1, no weight decay, replicated over tensor-parallel ranks, no bias), applied by
// ops/rmsnorm with fp32 statistics; with 16-bit parameters the output is 16-bit words.
#pragma once
#include <string>

#include "layers/layer_modules.hpp"
#include "layers/param_store.hpp"

namespace trident {

class RMSNorm final : public NormModule {
 public:
  RMSNorm(ParamStore& store, const std::string& name, std::int64_t C, float eps);
  // x (N, C) fp32 -> out (N, C); rstd (N) kept for the backward pass; mean is not used.
  void forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, std::int64_t N,
               const ResidualAdd& pre = {}) const override;
  void backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView& mean,
                const FloatView& rstd, std::int64_t N) const override;

 private:
  ParamStore* store_ = nullptr;
  ParamId w_ = -1;
  std::int64_t C_ = 0;
  float eps_ = 1e-5f;
};

}  // namespace trident
