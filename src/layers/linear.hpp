// Linear layer y = x W^T + b with W stored [out, in] (PyTorch's convention, as in checkpoints).
// The tensor-parallel variants (column/row split) build on this with the TP communicator.
#pragma once
#include <string>

#include "layers/param_store.hpp"

namespace trident {

class Linear {
 public:
  Linear() = default;
  Linear(ParamStore& store, const std::string& name, std::int64_t in, std::int64_t out, float init_std,
         bool bias = true);

  // y (N, out) = x (N, in) W^T + b
  void forward(const FloatView& y, const FloatView& x, std::int64_t N) const;
  // dx (N, in) = dy W (overwritten unless accumulate_dx); dW += dy^T x; db += colsum(dy)
  void backward(const FloatView& dx, const FloatView& dy, const FloatView& x, std::int64_t N,
                bool accumulate_dx = false) const;

  std::int64_t in() const { return in_; }
  std::int64_t out() const { return out_; }

 private:
  ParamStore* store_ = nullptr;
  ParamId w_ = -1, b_ = -1;
  std::int64_t in_ = 0, out_ = 0;
};

}  // namespace trident
