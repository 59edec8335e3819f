// ColumnParallelLinear and RowParallelLinear (parallel_linear.hpp; docs/DESIGN.md "Tensor and
// sequence parallelism"). The constructors declare this rank's weight and bias slices with their
// place in the global tensor (column: out/tp rows, in row_blocks blocks for a fused q|k|v, bias
// split alike; row: in/tp columns, bias replicated), which checkpoints and initialisation use.
// forward / backward run the GEMMs through ops/gemm (fp32) or gemm_mixed (16-bit operands, fp32
// accumulation) between the region operations of layers/tensor_parallel.
#include "layers/parallel_linear.hpp"

#include <cmath>

#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_lt.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

namespace {

// The output gradient's 16-bit copy dy16 for the backward GEMMs of 16-bit weights, and with
// dbias the bias gradient dbias += column sums of dy: one fused pass where the bias gradient and
// the copy come together (bias_backward_pack_half), else each alone.
void output_grad(const Act& w, const FloatView& dy, const HalfView& dy16, std::int64_t rows, std::int64_t n_out,
                 const FloatView& dbias) {
  const bool bias = dbias.extent(0) > 0;
  if (w.is_half() && bias)
    bias_backward_pack_half(w.dt, dbias, dy16, dy, rows, n_out);
  else if (w.is_half())
    pack_half(w.dt, dy16, dy, rows * n_out);
  else if (bias)
    bias_backward(dbias, dy, rows, n_out);
}

// dx (rows, n_in) = dy (rows, n_out) W (n_out, n_in) and dW (n_out, n_in) += dy^T x: the two
// backward GEMMs of both parallel linears. 16-bit weights: the GEMMs take dy16, dy rounded to 16
// bits (output_grad), with fp32 accumulation.
void linear_backward_gemms(std::int64_t rows, std::int64_t n_in, std::int64_t n_out, const FloatView& dy, const Act& w,
                           const Act& x, const FloatView& dx, const FloatView& dw, const HalfView& dy16,
                           const HalfView& dx16 = {}) {
  if (dx16.extent(0) > 0) {  // dx in 16 bits from its GEMM (RowParallelLinear::input_grad_half_ok)
    const GemmOperand g = operand(w.dt, dy16.data());
    gemm_lt(lt_call(Trans::N, Trans::N, rows, n_in, n_out, g, n_out, operand(w), n_in, w.dt, dx16.data(), n_in));
    if (dw.extent(0) > 0)
      gemm_mixed(Trans::T, Trans::N, n_out, n_in, rows, 1.f, g, n_out, operand(x), n_in, 1.f, dw.data(), n_in);
    return;
  }
  if (!w.is_half()) {
    gemm(Trans::N, Trans::N, rows, n_in, n_out, 1.f, dy.data(), n_out, w.f.data(), n_in, 0.f, dx.data(), n_in);
    gemm(Trans::T, Trans::N, n_out, n_in, rows, 1.f, dy.data(), n_out, x.f.data(), n_in, 1.f, dw.data(), n_in);
    return;
  }
  const GemmOperand g = operand(w.dt, dy16.data());
  gemm_mixed(Trans::N, Trans::N, rows, n_in, n_out, 1.f, g, n_out, operand(w), n_in, 0.f, dx.data(), n_in);
  gemm_mixed(Trans::T, Trans::N, n_out, n_in, rows, 1.f, g, n_out, operand(x), n_in, 1.f, dw.data(), n_in);
}

// dx (rows, n_in) = dy W only (a frozen W: no weight gradient); 16-bit weights: from dy16.
void frozen_backward_gemm(std::int64_t rows, std::int64_t n_in, std::int64_t n_out, const FloatView& dy, const Act& w,
                          const FloatView& dx, const HalfView& dy16) {
  if (!w.is_half()) {
    gemm(Trans::N, Trans::N, rows, n_in, n_out, 1.f, dy.data(), n_out, w.f.data(), n_in, 0.f, dx.data(), n_in);
    return;
  }
  gemm_mixed(Trans::N, Trans::N, rows, n_in, n_out, 1.f, operand(w.dt, dy16.data()), n_out, operand(w), n_in, 0.f,
             dx.data(), n_in);
}

// The adapters of projection `name` whose weight is w (LoraAdapters in parallel_linear.hpp):
// `column` true: B (out, rank) split by rows like W, A (rank, in) replicated; false: A split by
// columns like W, B replicated.
LoraAdapters declare_lora(ParamStore& store, const std::string& name, const ParamInfo& w, bool column, LoraSpec spec,
                          std::int64_t rows) {
  LoraAdapters l;
  if (spec.rank <= 0) return l;
  const std::int64_t r = spec.rank;
  l.rank = r;
  l.scale = spec.scale;
  ParamInfo a;
  a.name = name + "/lora_a";
  a.shape = {r, w.shape[1]};
  a.global_shape = {r, w.global_shape[1]};
  a.global_offset = {0, column ? 0 : w.global_offset[1]};
  a.valid = {r, w.valid[1]};
  a.tp_replicated = column;
  a.weight_decay = true;
  a.adapter = true;
  a.init_std = 1.f / std::sqrt(3.f * static_cast<float>(w.global_shape[1]));
  ParamInfo b;
  b.name = name + "/lora_b";
  b.shape = {w.shape[0], r};
  b.global_shape = {w.global_shape[0], r};
  b.global_offset = {column ? w.global_offset[0] : 0, 0};
  b.valid = {w.valid[0], r};
  b.row_blocks = column ? w.row_blocks : 1;
  if (column) b.blocks = w.blocks;
  b.tp_replicated = !column;
  b.weight_decay = true;
  b.adapter = true;
  b.init_std = 0.f;
  b.init_value = 0.f;
  l.a = store.declare(a);
  l.b = store.declare(b);
  l.u32 = make_float("lora::u32", rows * r);
  l.du32 = make_float("lora::du32", rows * r);
  if (store.dtype() != DType::F32) {
    l.u16 = make_half("lora::u16", rows * r);
    l.du16 = make_half("lora::du16", rows * r);
  }
  return l;
}

// u (rows, rank) = x A^T, as a GEMM operand (rounded to 16 bits with 16-bit parameters).
GemmOperand lora_down(const ParamStore& store, const LoraAdapters& l, std::int64_t rows, std::int64_t n_in,
                      GemmOperand x) {
  const Act a = store.param(l.a);  // (rank, n_in)
  gemm_mixed(Trans::N, Trans::T, rows, l.rank, n_in, 1.f, x, n_in, operand(a), n_in, 0.f, l.u32.data(), l.rank);
  if (!a.is_half()) return operand(l.u32.data());
  pack_half(a.dt, l.u16, l.u32, rows * l.rank);
  return operand(a.dt, l.u16.data());
}

// y (rows, n_out) += scale (x A^T) B^T
void lora_forward(const ParamStore& store, const LoraAdapters& l, std::int64_t rows, std::int64_t n_in,
                  std::int64_t n_out, GemmOperand x, float* y) {
  const GemmOperand u = lora_down(store, l, rows, n_in, x);
  gemm_mixed(Trans::N, Trans::T, rows, n_out, l.rank, l.scale, u, l.rank, operand(store.param(l.b)), l.rank, 1.f, y,
             n_out);
}

// From dy (rows, n_out) and the forward input x (rows, n_in): dB += scale dy^T u, du = scale dy B,
// dA += du^T x, dx += du A (u = x A^T recomputed).
void lora_backward(const ParamStore& store, const LoraAdapters& l, std::int64_t rows, std::int64_t n_in,
                   std::int64_t n_out, GemmOperand dy, GemmOperand x, float* dx) {
  const Act a = store.param(l.a), b = store.param(l.b);
  const GemmOperand u = lora_down(store, l, rows, n_in, x);
  gemm_mixed(Trans::T, Trans::N, n_out, l.rank, rows, l.scale, dy, n_out, u, l.rank, 1.f, store.grad(l.b).data(),
             l.rank);
  gemm_mixed(Trans::N, Trans::N, rows, l.rank, n_out, l.scale, dy, n_out, operand(b), l.rank, 0.f, l.du32.data(),
             l.rank);
  GemmOperand du = operand(l.du32.data());
  if (a.is_half()) {
    pack_half(a.dt, l.du16, l.du32, rows * l.rank);
    du = operand(a.dt, l.du16.data());
  }
  gemm_mixed(Trans::T, Trans::N, l.rank, n_in, rows, 1.f, du, l.rank, x, n_in, 1.f, store.grad(l.a).data(), n_in);
  gemm_mixed(Trans::N, Trans::N, rows, n_in, l.rank, 1.f, du, l.rank, operand(a), n_in, 1.f, dx, n_in);
}

// The output gradient as a GEMM operand: dy, or its 16-bit copy dy16 (rounded by the base GEMMs).
GemmOperand dy_operand(const Act& w, const FloatView& dy, const HalfView& dy16) {
  return w.is_half() ? operand(w.dt, dy16.data()) : operand(dy.data());
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParamStore& store, const std::string& name, std::int64_t in,
                                           std::int64_t out, float init_std, const TensorParallel& tp,
                                           std::int64_t rows, const RowBlocks& row_blocks, LoraSpec lora, bool bias)
    : store_(&store), tp_(tp), in_(in), rows_(rows) {
  const std::int64_t p = tp.size(), r = tp.rank();
  ParamInfo w;
  w.name = name + "/weight";
  if (row_blocks.sizes.empty()) {
    const std::int64_t nb = row_blocks.count;
    TRIDENT_REQUIRE(out % (p * nb) == 0, name << ": output size " << out << " is not divisible by tp = " << p);
    const std::int64_t local_block = out / nb / p;
    w.global_offset = {r * local_block, 0};
    w.valid = {local_block, in};
    w.row_blocks = nb;
  } else {  // blocks of unequal sizes: each split over TP, this rank's parts one after another
    std::int64_t local0 = 0, global0 = 0;
    for (const std::int64_t g : row_blocks.sizes) {
      TRIDENT_REQUIRE(g % p == 0, name << ": a row block of " << g << " rows is not divisible by tp = " << p);
      w.blocks.push_back({local0, global0 + r * (g / p), g / p});
      local0 += g / p;
      global0 += g;
    }
    TRIDENT_REQUIRE(global0 == out, "internal: " << name << ": row blocks of " << global0 << " rows for " << out);
    w.global_offset = {0, 0};
    w.valid = {local0, in};
  }
  out_local_ = out / p;
  w.shape = {out_local_, in};
  w.global_shape = {out, in};
  w.tp_replicated = false;
  w.weight_decay = true;
  w.init_std = init_std;
  w_ = store.declare(w);
  ParamInfo b = w;
  b.name = name + "/bias";
  b.shape = {out_local_};
  b.global_shape = {out};
  b.global_offset = {w.global_offset[0]};
  b.valid = {w.valid[0]};
  b.weight_decay = false;
  b.init_std = 0.f;
  b.init_value = 0.f;
  if (bias)
    b_ = store.declare(b);
  else
    zeros_ = make_act(store.dtype(), "column_linear::no_bias", out_local_);
  lora_ = declare_lora(store, name, w, true, lora, rows);
  if (tp.sequence_parallel) {
    dgathered_ = make_float("column_linear::dgathered", rows * in);
  }
}

namespace {
// y (rows, out) = x (rows, in) W^T (W: (out, in)) through gemm_lt, with its epilogue
GemmLt linear_lt(const Act& x, const Act& w, std::int64_t rows, std::int64_t in, std::int64_t out, const Act& y) {
  return lt_call(Trans::N, Trans::T, rows, out, in, operand(x), in, operand(w), in, y.dt,
                 y.is_half() ? static_cast<void*>(y.h.data()) : static_cast<void*>(y.f.data()), out);
}
}  // namespace

bool ColumnParallelLinear::gelu_epilogue() const {
  return kDeviceKernels && store_->dtype() != DType::F32 && !lora_.on();
}

void ColumnParallelLinear::forward_gelu(const Act& pre, const Act& out, const Act& x, const Act& gathered) {
  TRIDENT_REQUIRE(gelu_epilogue(), "internal: forward_gelu needs device kernels, 16-bit parameters and no adapters");
  Act input = x;
  if (tp_.sequence_parallel) {
    GatherFromSequenceParallelRegion::forward(tp_, gathered, x, rows_ / tp_.size(), in_);
    input = gathered;
  }
  const Act b = bias();
  GemmLt g = linear_lt(input, store_->param(w_), rows_, in_, out_local_, out);
  g.epilogue = Epilogue::GeluAuxBias;
  g.bias = b.h.data();
  g.bias_dt = b.dt;
  g.aux = pre.h.data();
  g.ldaux = out_local_;
  gemm_lt(g);
}

void ColumnParallelLinear::forward(const Act& y, const Act& x, const Act& gathered, const FloatView& y32,
                                   bool add_bias_here) {
  const Act w = store_->param(w_);  // (out/tp, in)
  Act input = x;                    // (rows, in) once gathered
  if (tp_.sequence_parallel) {
    GatherFromSequenceParallelRegion::forward(tp_, gathered, x, rows_ / tp_.size(), in_);  // -> (rows, in)
    input = gathered;
  }
  if (kDeviceKernels && w.is_half() && add_bias_here && !lora_.on()) {  // the GEMM writes y, bias added
    GemmLt g = linear_lt(input, w, rows_, in_, out_local_, y);
    if (b_ >= 0) {
      g.epilogue = Epilogue::Bias;
      g.bias = store_->value16(b_).data();
      g.bias_dt = w.dt;
    }
    gemm_lt(g);
    return;
  }
  if (!w.is_half()) {
    gemm(Trans::N, Trans::T, rows_, out_local_, in_, 1.f, input.f.data(), in_, w.f.data(), in_, 0.f, y.f.data(),
         out_local_);
    if (lora_.on()) lora_forward(*store_, lora_, rows_, in_, out_local_, operand(input), y.f.data());
    if (add_bias_here && b_ >= 0) add_bias(y.f, store_->value(b_), rows_, out_local_);
    return;
  }
  gemm_mixed(Trans::N, Trans::T, rows_, out_local_, in_, 1.f, operand(input), in_, operand(w), in_, 0.f, y32.data(),
             out_local_);
  if (lora_.on()) lora_forward(*store_, lora_, rows_, in_, out_local_, operand(input), y32.data());
  if (add_bias_here && b_ >= 0)
    add_bias_pack_half(w.dt, y.h, y32, store_->value16(b_), rows_, out_local_);
  else if (add_bias_here)
    pack_half(w.dt, y.h, y32, rows_ * out_local_);
}

void ColumnParallelLinear::backward(const FloatView& dx, const FloatView& dy, const Act& x, const Act& gathered,
                                    const HalfView& dy16, bool dy_ready) {
  const Act w = store_->param(w_);        // (out/tp, in)
  const FloatView dw = store_->grad(w_);  // (out/tp, in)
  if (tp_.sequence_parallel)              // re-gather the row-split input rather than keeping it
    GatherFromSequenceParallelRegion::forward(tp_, gathered, x, rows_ / tp_.size(), in_);
  const Act input = tp_.sequence_parallel ? gathered : x;            // (rows, in)
  const FloatView dinput = tp_.sequence_parallel ? dgathered_ : dx;  // (rows, in)
  // d input (rows, in) = dy (rows, out/tp) W_local (out/tp, in): a partial sum over TP ranks;
  // dW_local += dy^T input
  const bool train_w = store_->trains(w_);
  TRIDENT_REQUIRE(!dy_ready || w.is_half(), "internal: a ready output gradient needs 16-bit parameters");
  if (!dy_ready) output_grad(w, dy, dy16, rows_, out_local_, bias_grad());
  if (train_w)
    linear_backward_gemms(rows_, in_, out_local_, dy, w, input, dinput, dw, dy16);
  else
    frozen_backward_gemm(rows_, in_, out_local_, dy, w, dinput, dy16);
  if (lora_.on())
    lora_backward(*store_, lora_, rows_, in_, out_local_, dy_operand(w, dy, dy16), operand(input), dinput.data());
  if (tp_.sequence_parallel)
    GatherFromSequenceParallelRegion::backward(tp_, dx, dgathered_, rows_, in_);  // -> (rows/tp, in)
  else
    CopyToTensorParallelRegion::backward(tp_, dx, rows_ * in_);
}

RowParallelLinear::RowParallelLinear(ParamStore& store, const std::string& name, std::int64_t in, std::int64_t out,
                                     float init_std, const TensorParallel& tp, std::int64_t rows, LoraSpec lora,
                                     bool bias)
    : store_(&store), tp_(tp), out_(out), rows_(rows) {
  const std::int64_t p = tp.size(), r = tp.rank();
  TRIDENT_REQUIRE(in % p == 0, name << ": input size " << in << " is not divisible by tp = " << p);
  in_local_ = in / p;
  ParamInfo w;
  w.name = name + "/weight";
  w.shape = {out, in_local_};
  w.global_shape = {out, in};
  w.global_offset = {0, r * in_local_};
  w.valid = {out, in_local_};
  w.tp_replicated = false;
  w.weight_decay = true;
  w.init_std = init_std;
  w_ = store.declare(w);
  if (bias)
    b_ = store.declare(name + "/bias", {out}, false, 0.f, 0.f);  // replicated over TP
  else
    zeros_ = make_act(store.dtype(), "row_linear::no_bias", out);
  lora_ = declare_lora(store, name, w, false, lora, rows);
  if (tp.sequence_parallel) partial_ = make_float("row_linear::partial", rows * out);
  if (tp.sequence_parallel) dy_full_ = make_float("row_linear::dy_full", rows * out);
}

void RowParallelLinear::forward(const FloatView& y, const Act& x, bool add_bias_here) {
  const Act w = store_->param(w_);  // (out, in/tp)
  const std::int64_t p = tp_.size();
  const FloatView out = tp_.sequence_parallel ? partial_ : y;  // (rows, out), partial sums over TP
  gemm_mixed(Trans::N, Trans::T, rows_, out_, in_local_, 1.f, operand(x), in_local_, operand(w), in_local_, 0.f,
             out.data(), out_);
  if (lora_.on()) lora_forward(*store_, lora_, rows_, in_local_, out_, operand(x), out.data());
  std::int64_t out_rows = rows_;
  if (tp_.sequence_parallel) {
    ReduceScatterToSequenceParallelRegion::forward(tp_, y, partial_, rows_, out_);  // -> (rows/tp, out)
    out_rows = rows_ / p;
  } else {
    ReduceFromTensorParallelRegion::forward(tp_, y, rows_ * out_);
  }
  if (add_bias_here && b_ >= 0) add_bias(y, store_->param(b_), out_rows, out_);
}

void RowParallelLinear::backward(const FloatView& dx, const FloatView& dy, const Act& x, const HalfView& dy16,
                                 bool dy_ready, const HalfView& dx16) {
  const Act w = store_->param(w_);        // (out, in/tp)
  const FloatView dw = store_->grad(w_);  // (out, in/tp)
  const std::int64_t p = tp_.size();
  // The bias was added after the reduction: its gradient is dy over this rank's rows (with
  // sequence parallelism a partial sum, all-reduced over TP with the other replicated grads).
  const FloatView dbias = bias_grad();
  FloatView dfull = dy;  // (rows, out) once gathered
  TRIDENT_REQUIRE(!dy_ready || output_grad_ready_ok(),
                  "internal: a ready output gradient needs 16-bit parameters and no sequence parallelism");
  if (!dy_ready && tp_.sequence_parallel) {
    if (dbias.extent(0) > 0) bias_backward(dbias, dy, rows_ / p, out_);
    ReduceScatterToSequenceParallelRegion::backward(tp_, dy_full_, dy, rows_ / p, out_);
    dfull = dy_full_;
    output_grad(w, dfull, dy16, rows_, out_, FloatView());
  } else if (!dy_ready) {
    output_grad(w, dfull, dy16, rows_, out_, dbias);  // dy is every row's here: the bias gradient with the copy
  }
  // dx (rows, in/tp) = dy (rows, out) W_local (out, in/tp); dW_local += dy^T x
  const bool half_dx = dx16.extent(0) > 0;
  TRIDENT_REQUIRE(!half_dx || input_grad_half_ok(),
                  "internal: a 16-bit input gradient needs 16-bit parameters and "
                  "no adapters");
  if (store_->trains(w_))
    linear_backward_gemms(rows_, in_local_, out_, dfull, w, x, dx, dw, dy16, dx16);
  else if (half_dx)
    linear_backward_gemms(rows_, in_local_, out_, dfull, w, x, dx, FloatView(), dy16, dx16);
  else
    frozen_backward_gemm(rows_, in_local_, out_, dfull, w, dx, dy16);
  if (lora_.on())
    lora_backward(*store_, lora_, rows_, in_local_, out_, dy_operand(w, dfull, dy16), operand(x), dx.data());
}

void ColumnParallelLinear::infer(const FloatView& y, const FloatView& x, std::int64_t rows) const {
  TRIDENT_REQUIRE(!tp_.sequence_parallel && store_->dtype() == DType::F32 && !lora_.on(),
                  "internal: inference runs fp32 parameters without sequence parallelism or adapters");
  gemm(Trans::N, Trans::T, rows, out_local_, in_, 1.f, x.data(), in_, store_->value(w_).data(), in_, 0.f, y.data(),
       out_local_);
  if (b_ >= 0) add_bias(y, store_->param(b_), rows, out_local_);
}

void RowParallelLinear::infer(const FloatView& y, const FloatView& x, std::int64_t rows) const {
  TRIDENT_REQUIRE(!tp_.sequence_parallel && store_->dtype() == DType::F32 && !lora_.on(),
                  "internal: inference runs fp32 parameters without sequence parallelism or adapters");
  gemm(Trans::N, Trans::T, rows, out_, in_local_, 1.f, x.data(), in_local_, store_->value(w_).data(), in_local_, 0.f,
       y.data(), out_);
  TRIDENT_DEVICE_WAIT();
  ReduceFromTensorParallelRegion::forward(tp_, y, rows * out_);
  if (b_ >= 0) add_bias(y, store_->param(b_), rows, out_);
}

}  // namespace trident
