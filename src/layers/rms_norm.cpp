// RMSNorm (rms_norm.hpp): declares <name>/weight (C values, init 1, no weight decay).
#include "layers/rms_norm.hpp"

#include "ops/rmsnorm.hpp"

namespace trident {

RMSNorm::RMSNorm(ParamStore& store, const std::string& name, std::int64_t C, float eps)
    : store_(&store), C_(C), eps_(eps) {
  w_ = store.declare(name + "/weight", {C}, false, 0.f, 1.f);
}

void RMSNorm::forward(const Act& out, const FloatView&, const FloatView& rstd, const FloatView& x, std::int64_t N,
                      const ResidualAdd& pre) const {
  rmsnorm_forward(out, rstd, x, store_->param(w_), N, C_, eps_, pre);
}

void RMSNorm::backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView&,
                       const FloatView& rstd, std::int64_t N) const {
  rmsnorm_backward(dx, store_->grad(w_), dout, x, store_->param(w_), rstd, N, C_);
}

}  // namespace trident
