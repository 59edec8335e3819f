// Linear (linear.hpp): a y = x W^T + b replicated over TP whose GEMMs all go through
// gemm_mixed, so one path serves fp32 and 16-bit parameters (docs/DESIGN.md "Mixed precision").
// The weight [out, in] is declared with weight decay, the bias without; backward rounds dy into
// the 16-bit workspace dy16 first when the parameters are 16-bit, and dW and db accumulate in
// fp32.
#include "layers/linear.hpp"

#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

Linear::Linear(ParamStore& store, const std::string& name, std::int64_t in, std::int64_t out, float init_std, bool bias)
    : store_(&store), in_(in), out_(out) {
  w_ = store.declare(name + "/weight", {out, in}, /*weight_decay=*/true, init_std);
  if (bias) b_ = store.declare(name + "/bias", {out}, /*weight_decay=*/false, 0.f, 0.f);
}

void Linear::forward(const FloatView& y, const Act& x, std::int64_t N) const {
  const Act w = store_->param(w_);  // (out, in)
  gemm_mixed(Trans::N, Trans::T, N, out_, in_, 1.f, operand(x), in_, operand(w), in_, 0.f, y.data(), out_);
  if (b_ >= 0) add_bias(y, store_->param(b_), N, out_);
}

void Linear::backward(const FloatView& dx, const FloatView& dy, const Act& x, std::int64_t N,
                      const HalfView& dy16) const {
  const Act w = store_->param(w_);        // (out, in)
  const FloatView dw = store_->grad(w_);  // (out, in)
  GemmOperand g = operand(dy.data());     // dy (N, out): fp32, or its 16-bit copy
  if (w.is_half()) {
    pack_half(w.dt, dy16, dy, N * out_);
    g = operand(w.dt, dy16.data());
  }
  // dx (N, in) = dy (N, out) W (out, in)
  gemm_mixed(Trans::N, Trans::N, N, in_, out_, 1.f, g, out_, operand(w), in_, 0.f, dx.data(), in_);
  // dW (out, in) += dy^T (out, N) x (N, in)
  gemm_mixed(Trans::T, Trans::N, out_, in_, N, 1.f, g, out_, operand(x), in_, 1.f, dw.data(), in_);
  if (b_ >= 0) bias_backward(store_->grad(b_), dy, N, out_);
}

}  // namespace trident
