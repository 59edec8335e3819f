// LayerNorm (layer_norm.hpp): declares <name>/weight (init 1) and <name>/bias (init 0) of C
// values without weight decay; forward / backward run ops/layernorm on the parameters in the
// store's dtype. Statistics, the input gradient (added to dx) and
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
                        std::int64_t N, const ResidualAdd& pre) const {
  layernorm_forward(out, mean, rstd, x, store_->param(w_), store_->param(b_), N, C_, eps_, pre);
}

void LayerNorm::backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView& mean,
                         const FloatView& rstd, std::int64_t N) const {
  layernorm_backward(dx, store_->grad(w_), store_->grad(b_), dout, x, store_->param(w_), mean, rstd, N, C_);
}

}  // namespace trident
