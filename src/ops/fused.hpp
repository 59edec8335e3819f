// Fused elementwise kernels where Megatron fuses (bias_gelu_fusion, bias_dropout_add_fusion): one
// pass over memory instead of two or three. Each computes what its unfused sequence computes,
// the same float operations in the same order: bias + GELU is bitwise identical; in bias +
// dropout + add the compiler may contract the scaling and the add into one fused multiply-add
// (the unfused path rounds in between), a difference of at most one rounding (1 ulp).
#pragma once
#include <type_traits>

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "ops/dropout.hpp"

namespace trident {

// pre (rows, cols) = y + bias (kept for the GELU backward) and out = gelu(pre), from the fp32
// GEMM output y (which may be pre's own fp32 buffer); pre, out and bias are fp32 or 16-bit
// words of one type (16-bit: out = gelu of the rounded pre, as the unfused path computes).
void bias_gelu_forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
                       std::int64_t cols);

// out (rows, cols) = residual + dropout(branch + bias), all fp32 but the bias (fp32 or 16-bit).
// The dropout mask is element i's of a dropout call with spec d over the (rows, cols) branch.
// out may alias residual or branch.
void bias_dropout_add(const FloatView& out, const FloatView& residual, const FloatView& branch, const Act& bias,
                      std::int64_t rows, std::int64_t cols, const DropoutSpec& d);

// bias_dropout_add's value of element i (column i % cols) of a call with spec d: the residual r
// plus v = branch + bias (the bias loaded from format F) after dropout, rounded as that function
// rounds it; scale = 1 / (1 - d.p).
template <class F>
KOKKOS_INLINE_FUNCTION float bias_dropout_add_value(const DropoutSpec& d, float scale, float r, float v, std::int64_t i,
                                                    std::int64_t cols) {
  if (!d.active()) return r + v;
  const std::uint64_t ctr = d.mapped() ? d.counter(i, cols) : static_cast<std::uint64_t>(i);
  if (dropout_uniform(d.key, ctr) < d.p) return r + 0.f;
  if constexpr (std::is_same_v<F, Fp16Fmt>)
    return dmul(v, scale) + r;
  else
    return dfma(v, scale, r);
}

// A residual add done by the kernel that normalises its result (ops/layernorm, ops/rmsnorm: their
// forward's x = residual + dropout(branch + bias), bias_dropout_add's arguments and bits, x
// written as the norm reads it). Device kernels: one kernel, the row's lanes storing their groups of
// x, then the row normalised; host: bias_dropout_add, then the norm.
struct ResidualAdd {
  FloatView residual, branch;  // (rows, cols) fp32
  Act bias;                    // (cols), the norm's parameter type
  DropoutSpec d;
  bool on() const { return branch.extent(0) > 0; }
};

// A norm's device row kernel's residual add (ResidualAdd, F the bias's format and VW its view):
// the row's lanes store their groups of x (for_each_row's groups, so each lane later reads back
// what it wrote; no barrier).
template <class F, class VW>
struct ResidualRow {
  bool on = false;
  FloatView residual, branch;
  VW bias;
  DropoutSpec d;
  float scale = 1.f;
  explicit ResidualRow(const ResidualAdd& a) : on(a.on()) {
    if (!on) return;
    TRIDENT_REQUIRE(a.bias.dt == F::dtype, "internal: a residual add's bias is not of the norm's type");
    residual = a.residual;
    branch = a.branch;
    d = a.d;
    scale = d.active() ? 1.f / (1.f - d.p) : 1.f;
    if constexpr (std::is_same_v<VW, FloatView>)
      bias = a.bias.f;
    else
      bias = a.bias.h;
  }
  // whether its arrays take packed groups of rows of `cols` (rows_packed)
  bool packed(std::int64_t cols) const { return !on || rows_packed(cols, residual.data(), branch.data(), bias.data()); }
  KOKKOS_INLINE_FUNCTION void operator()(const RowTeam& t, const FloatView& x, std::int64_t base, std::int64_t cols,
                                         bool packed) const {
    if (!on) return;
    row_for_groups(t, cols, [&](std::int64_t c0, int cnt) {
      float r[kGroup], v[kGroup], bv[kGroup];
      load_group<F32Fmt>(residual.data() + base + c0, cnt, packed, r);
      load_group<F32Fmt>(branch.data() + base + c0, cnt, packed, v);
      load_group<F>(bias.data() + c0, cnt, packed, bv);
      for (int k = 0; k < kGroup; ++k)
        r[k] = bias_dropout_add_value<F>(d, scale, r[k], v[k] + bv[k], base + c0 + k, cols);
      store_group<F32Fmt>(x.data() + base + c0, cnt, packed, r);
    });
  }
};

// A norm's device backward row (ops/layernorm, ops/rmsnorm), over the row's 16-byte groups (as
// for_each_row's *_groups) of dout, the weight w (format F), x and dx at row offset base:
// norm_row_sum, the row's sum of term(dn, x) with dn = dout w, on every lane; norm_row_add, dx +=
// grad(dn, x) for every column.
template <class F, class WT, class Term>
KOKKOS_INLINE_FUNCTION float norm_row_sum(const RowTeam& t, std::int64_t C, std::int64_t base, bool packed,
                                          const float* dout, const WT* w, const float* x, const Term& term) {
  return row_sum_groups(t, C, [&](std::int64_t c0, int cnt) {
    float d[kGroup], wv[kGroup], xv[kGroup];
    load_group<F32Fmt>(dout + base + c0, cnt, packed, d);
    load_group<F>(w + c0, cnt, packed, wv);
    load_group<F32Fmt>(x + base + c0, cnt, packed, xv);
    float a = 0.f;
    for (int k = 0; k < cnt; ++k) a += term(d[k] * wv[k], xv[k]);
    return a;
  });
}
template <class F, class WT, class Grad>
KOKKOS_INLINE_FUNCTION void norm_row_add(const RowTeam& t, std::int64_t C, std::int64_t base, bool packed,
                                         const float* dout, const WT* w, const float* x, float* dx, const Grad& grad) {
  row_for_groups(t, C, [&](std::int64_t c0, int cnt) {
    float d[kGroup], wv[kGroup], xv[kGroup], g[kGroup];
    load_group<F32Fmt>(dout + base + c0, cnt, packed, d);
    load_group<F>(w + c0, cnt, packed, wv);
    load_group<F32Fmt>(x + base + c0, cnt, packed, xv);
    load_group<F32Fmt>(dx + base + c0, cnt, packed, g);
    for (int k = 0; k < kGroup; ++k) g[k] += grad(d[k] * wv[k], xv[k]);
    store_group<F32Fmt>(dx + base + c0, cnt, packed, g);
  });
}

// bias_dropout_add's backward into the branch's linear layer (the device path's row-parallel
// linears): dy16 (rows, cols) = round(dropout_backward(dout)) in the 16-bit type dt, and, with dbias
// not empty, dbias += the column sums of the unrounded values (the bias gradient). Device kernels:
// one pass (column_sums' layout, the copy written on the way; the same sums as dropout_backward
// then bias_backward); host: dropout_backward, bias_backward and pack_half on a temporary.
void dropout_backward_pack_half(DType dt, const HalfView& dy16, const FloatView& dbias, const FloatView& dout,
                                std::int64_t rows, std::int64_t cols, const DropoutSpec& d);

}  // namespace trident
