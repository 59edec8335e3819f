// Linear layer through ops/gemm.
#include "layers/linear.hpp"

#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"

namespace trident {

Linear::Linear(ParamStore& store, const std::string& name, std::int64_t in, std::int64_t out, float init_std,
               bool bias)
    : store_(&store), in_(in), out_(out) {
  w_ = store.declare(name + "/weight", {out, in}, /*weight_decay=*/true, init_std);
  if (bias) b_ = store.declare(name + "/bias", {out}, /*weight_decay=*/false, 0.f, 0.f);
}

void Linear::forward(const FloatView& y, const FloatView& x, std::int64_t N) const {
  const FloatView w = store_->value(w_);
  gemm(Trans::N, Trans::T, N, out_, in_, 1.f, x.data(), in_, w.data(), in_, 0.f, y.data(), out_);
  if (b_ >= 0) add_bias(y, store_->value(b_), N, out_);
}

void Linear::backward(const FloatView& dx, const FloatView& dy, const FloatView& x, std::int64_t N,
                      bool accumulate_dx) const {
  const FloatView w = store_->value(w_);
  const FloatView dw = store_->grad(w_);
  Kokkos::fence();
  // dx (N, in) = dy (N, out) W (out, in)
  gemm(Trans::N, Trans::N, N, in_, out_, 1.f, dy.data(), out_, w.data(), in_, accumulate_dx ? 1.f : 0.f, dx.data(),
       in_);
  // dW (out, in) += dy^T (out, N) x (N, in)
  gemm(Trans::T, Trans::N, out_, in_, N, 1.f, dy.data(), out_, x.data(), in_, 1.f, dw.data(), in_);
  if (b_ >= 0) bias_backward(store_->grad(b_), dy, N, out_);
}

}  // namespace trident
