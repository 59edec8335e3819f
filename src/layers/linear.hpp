// Linear layer y = x W^T + b with W stored [out, in] (PyTorch's convention, as in checkpoints),
// replicated on every tensor-parallel rank (BERT's heads); the split variants are in
// layers/parallel_linear. With 16-bit parameters (mixed precision) x is 16-bit words, the GEMMs
// take 16-bit inputs with fp32 accumulation, y and every gradient are fp32, and dy enters the
// backward GEMMs rounded to 16 bits (as Megatron's bf16 gradients are).
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
  void forward(const FloatView& y, const Act& x, std::int64_t N) const;
  // dx (N, in) = dy W (overwritten); dW += dy^T x; db += colsum(dy). dy16: scratch of N * out
  // 16-bit words (16-bit parameters only).
  void backward(const FloatView& dx, const FloatView& dy, const Act& x, std::int64_t N,
                const HalfView& dy16 = {}) const;

  std::int64_t in() const { return in_; }
  std::int64_t out() const { return out_; }

 private:
  ParamStore* store_ = nullptr;
  ParamId w_ = -1, b_ = -1;
  std::int64_t in_ = 0, out_ = 0;
};

}  // namespace trident
