// Small element-wise kernels over flat fp32 views (shapes beside each declaration): residual
// adds and accumulation, the bias broadcast and its column-sum gradient, tanh (BERT's pooler),
// strided row gathers (BERT's [CLS] rows) and their scatter-add backward, scaling, and the
// reductions over gradients (sum of squares for the norm, the non-finite check of fp16 steps).
#pragma once
#include <vector>

#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// out = a + b  (n elements)
void add(const FloatView& out, const FloatView& a, const FloatView& b, std::int64_t n);
// acc += x  (n elements)
void accumulate(const FloatView& acc, const FloatView& x, std::int64_t n);
// y (rows, cols) += bias (cols) broadcast over rows; the bias fp32 or bf16 / fp16 words (widened
// exactly, added in fp32)
void add_bias(const FloatView& y, const Act& bias, std::int64_t rows, std::int64_t cols);
// dbias (cols) += column sums of dy (rows, cols)
void bias_backward(const FloatView& dbias, const FloatView& dy, std::int64_t rows, std::int64_t cols);
// out = tanh(x); dx = dout * (1 - out^2)  (BERT's pooler)
void tanh_forward(const FloatView& out, const FloatView& x, std::int64_t n);
void tanh_backward(const FloatView& dx, const FloatView& dout, const FloatView& out, std::int64_t n);
// out (n, cols) = rows 0, stride, 2 stride, ... of x (fp32 or 16-bit words, out of x's type);
// and dx rows += dout (its backward, fp32)
void gather_strided_rows(const Act& out, const Act& x, std::int64_t n, std::int64_t stride, std::int64_t cols);
void scatter_add_strided_rows(const FloatView& dx, const FloatView& dout, std::int64_t n, std::int64_t stride,
                              std::int64_t cols);
// x *= s
void scale(const FloatView& x, float s, std::int64_t n);
// sum of squares of x (accumulated in double)
double sum_squares(const FloatView& x, std::int64_t n);
// true when x holds a NaN or an infinity
bool has_nonfinite(const FloatView& x, std::int64_t n);

// Sums of squares of ranges of one flat buffer by class, in a fixed number of launches (the device
// path of the gradient norm: one pass over every range's chunks of 32 values, then one sum per
// class, then one read of the sums), where sum_squares per range takes a launch and a read each.
// Built once for a set of ranges; sums[k] is the sum over the ranges of class k, in an order that
// depends only on the ranges (deterministic; not sum_squares' order).
class RangeSquares {
 public:
  struct Range {
    std::int64_t begin, end;
    int cls;
  };
  RangeSquares() = default;
  RangeSquares(std::vector<Range> ranges, int classes);
  bool built() const { return classes_ > 0; }
  std::vector<double> run(const FloatView& x) const;

 private:
  int classes_ = 0;
  std::int64_t chunks_ = 0;
  View1<std::int64_t> range_begin_, range_end_, range_chunk_;  // ranges sorted by class; first chunk of each
  std::vector<std::int64_t> class_chunk_;                      // first chunk of each class, and the total
  View1<double> part_, sums_;
};

}  // namespace trident
