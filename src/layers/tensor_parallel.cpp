// The collectives behind the region operations of tensor_parallel.hpp (docs/DESIGN.md "Tensor
// and sequence parallelism"): the all-reduce, the row all-gather (fp32 and 16-bit words) and the
// row reduce-scatter over the TP communicator; the row and column scatters, which only copy this
// rank's block; and the column gather, which all-gathers into a (tp, rows, cols) scratch and
// interleaves it into (rows, tp * cols). With tp = 1 each is a copy or nothing.
#include "layers/tensor_parallel.hpp"

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"

namespace trident {

void tp_allreduce(const TensorParallel& tp, const FloatView& x, std::int64_t n) {
  if (tp.size() > 1) tp.comm->allreduce_sum(x.data(), n);
}

void tp_gather_rows(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                    std::int64_t cols) {
  if (tp.size() == 1) {
    device_copy(slice(out, 0, rows * cols), slice(in, 0, rows * cols));
    return;
  }
  tp.comm->allgather(in.data(), out.data(), rows * cols);
}

void tp_gather_rows(const TensorParallel& tp, const HalfView& out, const HalfView& in, std::int64_t rows,
                    std::int64_t cols) {
  if (tp.size() == 1) {
    device_copy(slice(out, 0, rows * cols), slice(in, 0, rows * cols));
    return;
  }
  tp.comm->allgather(in.data(), out.data(), rows * cols);
}

void tp_reduce_scatter_rows(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                            std::int64_t cols) {
  const std::int64_t p = tp.size();
  if (rows % p != 0)
    throw Error::one("reduce-scatter of " + std::to_string(rows) + " rows over " + std::to_string(p) + " ranks");
  if (p == 1) {
    device_copy(slice(out, 0, rows * cols), slice(in, 0, rows * cols));
    return;
  }
  tp.comm->reduce_scatter(in.data(), out.data(), rows / p * cols);
}

void tp_scatter_rows(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                     std::int64_t cols) {
  const std::int64_t p = tp.size(), n = rows / p * cols;
  device_copy(slice(out, 0, n), slice(in, tp.rank() * n, n));
}

void tp_gather_columns(const TensorParallel& tp, const FloatView& out, const FloatView& in, const FloatView& scratch,
                       std::int64_t rows, std::int64_t cols) {
  const std::int64_t p = tp.size();
  if (p == 1) {
    device_copy(slice(out, 0, rows * cols), slice(in, 0, rows * cols));
    return;
  }
  tp.comm->allgather(in.data(), scratch.data(), rows * cols);
  // scratch (p, rows, cols) -> out (rows, p * cols)
  for_each_index(
      "tp::gather_columns", p * rows * cols, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t c = i % cols, r = (i / cols) % rows, k = i / (rows * cols);
        out(r * p * cols + k * cols + c) = scratch(i);
      });
}

void tp_scatter_columns(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                        std::int64_t cols) {
  const std::int64_t p = tp.size(), local = cols / p, k = tp.rank();
  for_each_index(
      "tp::scatter_columns", rows * local, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / local, c = i % local;
        out(i) = in(r * cols + k * local + c);
      });
}

}  // namespace trident
