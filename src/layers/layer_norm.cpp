// LayerNorm (layer_norm.hpp): declares <name>/weight (init 1) and <name>/bias (init 0) of C
// values without weight decay, and sends forward / backward to ops/layernorm's fp32 kernels or
// to their 16-bit twins by the store's dtype. Statistics, the input gradient (added to dx) and
// the parameter gradients stay fp32 (docs/DESIGN.md "Mixed precision").
#include "layers/layer_norm.hpp"

#include "ops/layernorm.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

LayerNorm::LayerNorm(ParamStore& store, const std::string& name, std::int64_t C, float eps)
    : store_(&store), C_(C), eps_(eps) {
  w_ = store.declare(name + "/weight", {C}, false, 0.f, 1.f);
  b_ = store.declare(name + "/bias", {C}, false, 0.f, 0.f);
}

void LayerNorm::forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
                        std::int64_t N) const {
  if (store_->dtype() == DType::F32)
    layernorm_forward(out.f, mean, rstd, x, store_->value(w_), store_->value(b_), N, C_, eps_);
  else
    layernorm_forward_half(store_->dtype(), out.h, mean, rstd, x, store_->value16(w_), store_->value16(b_), N, C_,
                           eps_);
}

void LayerNorm::backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView& mean,
                         const FloatView& rstd, std::int64_t N) const {
  if (store_->dtype() == DType::F32)
    layernorm_backward(dx, store_->grad(w_), store_->grad(b_), dout, x, store_->value(w_), mean, rstd, N, C_);
  else
    layernorm_backward_half(store_->dtype(), dx, store_->grad(w_), store_->grad(b_), dout, x, store_->value16(w_), mean,
                            rstd, N, C_);
}

}  // namespace trident
