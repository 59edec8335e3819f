// Tensor- and sequence-parallel region operations (Megatron's mappings), as forward/backward
// pairs over the TP communicator. Activations are (rows, cols) row-major; rows are tokens
// (B*T, batch-major), cols the hidden dimension.
//
//   tensor parallel (split along the hidden/columns dimension):
//     copy_to       forward: identity            backward: all-reduce
//     reduce_from   forward: all-reduce          backward: identity
//     scatter_to    forward: keep my column block backward: all-gather columns
//     gather_from   forward: all-gather columns  backward: keep my column block
//   sequence parallel (split along the token/rows dimension; rows % tp == 0):
//     gather_rows          forward: all-gather rows    backward: reduce-scatter rows
//     reduce_scatter_rows  forward: reduce-scatter rows backward: all-gather rows
//     scatter_rows         forward: keep my row block  backward: all-gather rows
// Splitting the flattened (batch, sequence) rows equals Megatron's sequence split for one
// sample and is the same partition of row-wise work (LayerNorm, dropout, residuals) otherwise.
#pragma once
#include "comm/communicator.hpp"
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

struct TensorParallel {
  const Communicator* comm = nullptr;  // the TP group
  bool sequence_parallel = false;
  // The expert-parallel group of MoE layers (Topology::ep_group; null: every expert on this rank)
  const Communicator* ep = nullptr;
  // The expert-tensor-parallel group (Topology::etp_group; null: every expert whole on this rank)
  const Communicator* etp = nullptr;
  // The context-parallel group (Topology::cp_group; null or of size 1: every rank holds whole
  // sequences) and its attention (false: ring attention, p2p; true: all-to-all over heads, a2a)
  const Communicator* cp = nullptr;
  bool cp_a2a = false;
  int cp_size() const { return cp ? cp->size() : 1; }
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// In place: x (n) summed over the TP group (reduce_from forward, copy_to backward).
void tp_allreduce(const TensorParallel& tp, const FloatView& x, std::int64_t n);
// out (rows * size, cols) = rows of every rank stacked in rank order.
void tp_gather_rows(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                    std::int64_t cols);
// out (rows / size, cols) = my block of the sum over ranks of in (rows, cols).
// 16-bit twin of tp_gather_rows (the sequence-parallel gather of a 16-bit LayerNorm output).
void tp_gather_rows(const TensorParallel& tp, const HalfView& out, const HalfView& in, std::int64_t rows,
                    std::int64_t cols);
void tp_reduce_scatter_rows(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                            std::int64_t cols);
// out (rows / size, cols) = my block of in (rows, cols), no communication.
void tp_scatter_rows(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                     std::int64_t cols);
// out (rows, cols * size) = column blocks of every rank side by side. scratch: rows*cols*size.
void tp_gather_columns(const TensorParallel& tp, const FloatView& out, const FloatView& in, const FloatView& scratch,
                       std::int64_t rows, std::int64_t cols);
// out (rows, cols / size) = my column block of in (rows, cols), no communication.
void tp_scatter_columns(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                        std::int64_t cols);

// The region operations by Megatron's names, each a forward/backward pair. Layers call these.
struct CopyToTensorParallelRegion {  // identity / all-reduce
  static void forward() {}
  static void backward(const TensorParallel& tp, const FloatView& grad, std::int64_t n) { tp_allreduce(tp, grad, n); }
};
struct ReduceFromTensorParallelRegion {  // all-reduce / identity
  static void forward(const TensorParallel& tp, const FloatView& x, std::int64_t n) { tp_allreduce(tp, x, n); }
  static void backward() {}
};
struct ScatterToTensorParallelRegion {  // keep my column block / all-gather columns
  static void forward(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                      std::int64_t cols) {
    tp_scatter_columns(tp, out, in, rows, cols);
  }
  static void backward(const TensorParallel& tp, const FloatView& din, const FloatView& dout, const FloatView& scratch,
                       std::int64_t rows, std::int64_t local_cols) {
    tp_gather_columns(tp, din, dout, scratch, rows, local_cols);
  }
};
struct GatherFromTensorParallelRegion {  // all-gather columns / keep my column block
  static void forward(const TensorParallel& tp, const FloatView& out, const FloatView& in, const FloatView& scratch,
                      std::int64_t rows, std::int64_t local_cols) {
    tp_gather_columns(tp, out, in, scratch, rows, local_cols);
  }
  static void backward(const TensorParallel& tp, const FloatView& din, const FloatView& dout, std::int64_t rows,
                       std::int64_t cols) {
    tp_scatter_columns(tp, din, dout, rows, cols);
  }
};
struct GatherFromSequenceParallelRegion {  // all-gather rows / reduce-scatter rows
  static void forward(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t local_rows,
                      std::int64_t cols) {
    tp_gather_rows(tp, out, in, local_rows, cols);
  }
  static void forward(const TensorParallel& tp, const Act& out, const Act& in, std::int64_t local_rows,
                      std::int64_t cols) {
    if (in.is_half())
      tp_gather_rows(tp, out.h, in.h, local_rows, cols);
    else
      tp_gather_rows(tp, out.f, in.f, local_rows, cols);
  }
  static void backward(const TensorParallel& tp, const FloatView& din, const FloatView& dout, std::int64_t rows,
                       std::int64_t cols) {
    tp_reduce_scatter_rows(tp, din, dout, rows, cols);
  }
};
struct ReduceScatterToSequenceParallelRegion {  // reduce-scatter rows / all-gather rows
  static void forward(const TensorParallel& tp, const FloatView& out, const FloatView& in, std::int64_t rows,
                      std::int64_t cols) {
    tp_reduce_scatter_rows(tp, out, in, rows, cols);
  }
  static void backward(const TensorParallel& tp, const FloatView& din, const FloatView& dout, std::int64_t local_rows,
                       std::int64_t cols) {
    tp_gather_rows(tp, din, dout, local_rows, cols);
  }
};

}  // namespace trident
