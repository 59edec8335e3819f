// Megatron's tensor-parallel linear layers, y = x W^T + b with W stored [out, in] globally.
//
// ColumnParallelLinear: W split along the output dimension (this rank: out/tp rows, or
//   row_blocks blocks of them for a fused q|k|v weight), bias split alike. Input through
//   copy_to (identity forward, all-reduce of the input gradient backward) or, with sequence
//   parallelism, through gather_rows (all-gather of the row-split input forward, reduce-scatter
//   of its gradient backward). Output: (rows, out/tp), the tensor-parallel region.
// RowParallelLinear: W split along the input dimension (this rank: in/tp columns), input in the
//   tensor-parallel region (rows, in/tp); partial outputs leave through reduce_from (all-reduce)
//   or, with sequence parallelism, reduce_scatter_rows; the bias (replicated) is added after.
// `rows` is the full token count B*T; with sequence parallelism a rank holds rows/tp of them
// outside the tensor-parallel region.
//
// LoRA (LoraSpec rank > 0): y gains scale * (x A^T) B^T, with A (rank, in) and B (out, rank),
// and W and the bias are frozen (no weight gradient is computed). The adapters are split like
// the layer: column-parallel B by rows like W (A replicated), row-parallel A by columns like W
// (B replicated), so that the low-rank term joins the partial output before the reduction. The
// replicated half's gradient is then a partial sum on each TP rank (all-reduced over TP by the
// trainer). A ~ normal(0, 1/sqrt(3 in)) (the variance of PEFT's default uniform), B = 0: at
// initialisation the model is exactly the base model.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "layers/param_store.hpp"
#include "layers/tensor_parallel.hpp"

namespace trident {

struct LoraSpec {
  std::int64_t rank = 0;  // 0: no adapters
  float scale = 1.f;      // alpha / rank
};

// The adapters of one projection and their workspaces (parallel_linear.cpp).
struct LoraAdapters {
  ParamId a = -1, b = -1;
  std::int64_t rank = 0;
  float scale = 1.f;
  FloatView u32, du32;  // (rows, rank): x A^T and its gradient
  HalfView u16, du16;   // 16-bit copies for the GEMMs with 16-bit parameters
  bool on() const { return rank > 0; }
};

// The row blocks of a fused column-parallel weight (q | k | v, gate | up), each split alike over
// TP so that rank r holds [block_0 part r; block_1 part r; ...]: `count` equal blocks, or blocks of
// the given global row counts (grouped-query attention's q | k | v: nh d, ng d, ng d).
struct RowBlocks {
  RowBlocks(std::int64_t n = 1) : count(n) {}  // NOLINT: an int means equal blocks
  RowBlocks(std::vector<std::int64_t> global_rows)
      : count(static_cast<std::int64_t>(global_rows.size())), sizes(std::move(global_rows)) {}
  std::int64_t count = 1;
  std::vector<std::int64_t> sizes;  // global rows per block; empty: `count` equal blocks
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  ColumnParallelLinear(ParamStore& store, const std::string& name, std::int64_t in, std::int64_t out, float init_std,
                       const TensorParallel& tp, std::int64_t rows, const RowBlocks& row_blocks = {},
                       LoraSpec lora = {}, bool bias = true);
  // y (rows, out/tp) from x (rows, in) or, with sequence parallelism, (rows/tp, in); then
  // `gathered` (rows, in) is a workspace for the all-gathered input (unused without sequence
  // parallelism). Like Megatron, the gathered input is not kept: backward gathers it again.
  // With 16-bit parameters x, gathered and y are 16-bit words: the GEMM (16-bit inputs, fp32
  // accumulation) writes the fp32 workspace y32 (rows, out/tp), and y = round(y32 + bias).
  // add_bias false (Megatron's skip_bias_add): the bias is left to a fused consumer (bias +
  // GELU); y.f then holds the GEMM output (fp32), or y32 does (16-bit: y is not written).
  // Device kernels (kDeviceKernels) with 16-bit parameters, add_bias and no adapters: one gemm_lt
  // call writes y = round(x W^T + bias) (ops/gemm_lt.hpp; y32 unused).
  void forward(const Act& y, const Act& x, const Act& gathered, const FloatView& y32 = {}, bool add_bias = true);
  // Whether forward_gelu applies: device kernels, 16-bit parameters, no adapters.
  bool gelu_epilogue() const;
  // pre = round(x W^T + bias) and out = round(gelu(x W^T + bias)) (the tanh form) in one gemm_lt
  // call (its GeluAuxBias epilogue); only where gelu_epilogue() holds.
  void forward_gelu(const Act& pre, const Act& out, const Act& x, const Act& gathered);
  // the bias; zeros for a layer without one (bias false: Megatron's --disable-bias-linear)
  Act bias() const { return b_ >= 0 ? store_->param(b_) : zeros_; }
  // dx (like x, fp32) from the fp32 dy (rows, out/tp); x is the forward input, `gathered` a
  // workspace. With 16-bit parameters dy is rounded into the workspace dy16 for the GEMMs and the
  // weight gradient accumulates in fp32.
  // dy_ready: the caller already wrote dy16 and added bias_grad() (a fused producer of dy, such as
  // the MLP activation's backward on the device path); dy is then not read. Only where
  // output_grad_ready_ok() holds.
  void backward(const FloatView& dx, const FloatView& dy, const Act& x, const Act& gathered, const HalfView& dy16 = {},
                bool dy_ready = false);
  // Whether backward takes dy_ready: 16-bit parameters.
  bool output_grad_ready_ok() const { return store_->dtype() != DType::F32; }
  // The bias gradient backward adds dy's column sums to (empty: none, or the weight is frozen).
  FloatView bias_grad() const { return b_ >= 0 && store_->trains(w_) ? store_->grad(b_) : FloatView(); }
  std::int64_t gathered_size() const { return tp_.sequence_parallel ? rows_ * in_ : 0; }
  std::int64_t local_out() const { return out_local_; }
  // Inference (generation): y (rows, out/tp) = x (rows, in) W^T + b for any row count, fp32
  // parameters, no sequence parallelism.
  void infer(const FloatView& y, const FloatView& x, std::int64_t rows) const;

 private:
  ParamStore* store_ = nullptr;
  TensorParallel tp_;
  ParamId w_ = -1, b_ = -1;  // b_ -1: no bias
  Act zeros_;                // stands for the absent bias in fused consumers
  std::int64_t in_ = 0, out_local_ = 0, rows_ = 0;
  FloatView dgathered_;  // (rows, in) under sequence parallelism
  LoraAdapters lora_;
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  RowParallelLinear(ParamStore& store, const std::string& name, std::int64_t in, std::int64_t out, float init_std,
                    const TensorParallel& tp, std::int64_t rows, LoraSpec lora = {}, bool bias = true);
  // y (rows, out) or, with sequence parallelism, (rows/tp, out), from x (rows, in/tp).
  // x is fp32 or (16-bit parameters) 16-bit words; y is fp32 (the residual branch).
  // add_bias false: the bias is left to a fused consumer (bias + dropout + residual add).
  void forward(const FloatView& y, const Act& x, bool add_bias = true);
  // the bias; zeros for a layer without one (bias false: Megatron's --disable-bias-linear)
  Act bias() const { return b_ >= 0 ? store_->param(b_) : zeros_; }
  // dx (rows, in/tp) fp32 from the fp32 dy (like y); x is the forward input; dy16 a 16-bit
  // workspace (rows, out) with 16-bit parameters.
  // dy_ready: the caller already wrote dy16 and added bias_grad() (a fused producer of dy, such as
  // the residual branch's dropout backward on the device path); dy is then not read. Only where
  // output_grad_ready_ok() holds.
  // dx16 (where input_grad_half_ok()): the input gradient written in 16 bits there by its GEMM
  // (cuBLASLt), dx not written.
  void backward(const FloatView& dx, const FloatView& dy, const Act& x, const HalfView& dy16 = {},
                bool dy_ready = false, const HalfView& dx16 = {});
  // Whether backward takes dy_ready: 16-bit parameters, no sequence parallelism (which sums the bias
  // gradient over the rank's rows and rounds the gathered gradient).
  bool output_grad_ready_ok() const { return store_->dtype() != DType::F32 && !tp_.sequence_parallel; }
  // Whether backward takes dx16: 16-bit parameters, no adapters (which add into an fp32 dx).
  bool input_grad_half_ok() const { return store_->dtype() != DType::F32 && !lora_.on(); }
  // The bias gradient backward adds dy's column sums to (empty: none, or the bias is frozen).
  FloatView bias_grad() const { return b_ >= 0 && store_->trains(b_) ? store_->grad(b_) : FloatView(); }
  std::int64_t local_in() const { return in_local_; }
  // Inference (generation): y (rows, out) = x (rows, in/tp) W_local^T summed over TP, + b, for
  // any row count, fp32 parameters, no sequence parallelism.
  void infer(const FloatView& y, const FloatView& x, std::int64_t rows) const;

 private:
  ParamStore* store_ = nullptr;
  TensorParallel tp_;
  ParamId w_ = -1, b_ = -1;  // b_ -1: no bias
  Act zeros_;                // stands for the absent bias in fused consumers
  std::int64_t in_local_ = 0, out_ = 0, rows_ = 0;
  FloatView partial_, dy_full_;  // (rows, out) under sequence parallelism
  LoraAdapters lora_;
};

}  // namespace trident
