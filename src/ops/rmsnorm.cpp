// RMSNorm forward/backward (rmsnorm.hpp), laid out as ops/layernorm: one thread per row for the
// row-wise parts (the rank's host threads through common/host_parallel), blocks of channels for
// the weight gradient (deterministic, no atomics).
#include "ops/rmsnorm.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "common/host_parallel.hpp"
#include "common/simd.hpp"
#include "ops/fused.hpp"

namespace trident {

namespace detail {

// The host kernels as in ops/layernorm: compiled with -ffp-contract=off, fused multiply-adds spelled
// dfma (the bits independent of the vectoriser); kRowBlock rows' sums side by side.
constexpr int kRowBlock = 8;

template <class F, class VO, class VW>
void rmsnorm_forward(const VO& out, const FloatView& rstd, const FloatView& x, const VW& w, std::int64_t N,
                     std::int64_t C, float eps, const ResidualAdd& pre) {
  if constexpr (kDeviceKernels) {  // a warp per row, 16-byte groups (common/device_parallel.hpp)
    const ResidualRow<F, VW> add(pre);
    const float* xd = x.data();
    auto* od = out.data();
    const auto* wd = w.data();
    const bool packed = rows_packed(C, xd, od, wd) && add.packed(C);
    for_each_row(
        add.on ? "ops::residual_rmsnorm_forward" : "ops::rmsnorm_forward", N,
        KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
          const std::int64_t base = n * C;
          add(t, x, base, C, packed);
          const float ms = row_sum_values<F32Fmt>(t, C, xd + base, packed, [](float v) { return v * v; }) / C;
          const float r = 1.f / dsqrt(ms + eps);
          row_for_groups(t, C, [&](std::int64_t c0, int cnt) {
            float v[kGroup], wv[kGroup];
            load_group<F32Fmt>(xd + base + c0, cnt, packed, v);
            load_group<F>(wd + c0, cnt, packed, wv);
            for (int k = 0; k < kGroup; ++k) v[k] = v[k] * r * wv[k];
            store_group<F>(od + base + c0, cnt, packed, v);
          });
          row_once(t, [&]() { rstd(n) = r; });
        });
  } else {
    if (pre.on()) bias_dropout_add(x, pre.residual, pre.branch, pre.bias, N, C, pre.d);
    // the host: kRowBlock rows at a time, their sums side by side (each row's as a row alone)
    const float* xd = x.data();
    for_each_row_block<kRowBlock>("ops::rmsnorm_forward", N, [=](auto rows, std::int64_t n0) {
      constexpr int R = decltype(rows)::value;
      const float* xr[R];
      float ms[R];
      for (int k = 0; k < R; ++k) {
        xr[k] = xd + (n0 + k) * C;
        ms[k] = 0.f;
      }
      for (std::int64_t c = 0; c < C; ++c)
        for (int k = 0; k < R; ++k) ms[k] += xr[k][c] * xr[k][c];
      for (int k = 0; k < R; ++k) {
        ms[k] /= C;
        const float r = 1.f / dsqrt(ms[k] + eps);
        const std::int64_t base = (n0 + k) * C;
        for (std::int64_t c = 0; c < C; ++c) out(base + c) = F::store(xr[k][c] * r * F::load(w(c)));
        rstd(n0 + k) = r;
      }
    });
  }
}

// y = x r w with r = (mean(x^2) + eps)^(-1/2): dx = r (dn - xhat mean(dn xhat)), dn = dout w,
// xhat = x r; dw = sum_n dout xhat.
template <class F, class VW>
void rmsnorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& dout, const FloatView& x, const VW& w,
                      const FloatView& rstd, std::int64_t N, std::int64_t C) {
  if constexpr (kDeviceKernels) {
    // a team per part of the rows: each row's input gradient (a warp per row, 16-byte groups) and
    // the weight gradient's sums of the same rows in one kernel (as ops/layernorm)
    const float *xd = x.data(), *dd = dout.data(), *rd = rstd.data();
    float* dxd = dx.data();
    const auto* wd = w.data();
    const bool packed = rows_packed(C, xd, dd, dxd, wd);
    rows_with_column_sums<1>(
        "ops::rmsnorm_backward", N, C,
        KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
          const std::int64_t base = n * C;
          const float r = rstd(n);
          const float mean_dx = norm_row_sum<F>(t, C, base, packed, dd, wd, xd,
                                                [&](float dn, float xv) { return dn * xv * r; }) /
                                C;
          norm_row_add<F>(t, C, base, packed, dd, wd, xd, dxd,
                          [&](float dn, float xv) { return r * (dn - xv * r * mean_dx); });
        },
        KOKKOS_LAMBDA(std::int64_t n, std::int64_t c, float* acc) { acc[0] += dd[n * C + c] * xd[n * C + c] * rd[n]; },
        ColumnOut<1>{{dw.data()}});
    return;
  } else {
    // the host: kRowBlock rows at a time, their sums side by side (each row's as a row alone)
    const float *xd = x.data(), *dd = dout.data();
    for_each_row_block<kRowBlock>("ops::rmsnorm_backward_input", N, [=](auto rows, std::int64_t n0) {
      constexpr int R = decltype(rows)::value;
      const float *xr[R], *dr[R];
      float r[R], mean_dx[R];
      for (int k = 0; k < R; ++k) {
        xr[k] = xd + (n0 + k) * C;
        dr[k] = dd + (n0 + k) * C;
        r[k] = rstd(n0 + k);
        mean_dx[k] = 0.f;
      }
      for (std::int64_t c = 0; c < C; ++c) {
        const float wc = F::load(w(c));
        for (int k = 0; k < R; ++k) mean_dx[k] += dr[k][c] * wc * xr[k][c] * r[k];
      }
      for (int k = 0; k < R; ++k) {
        mean_dx[k] /= C;
        const std::int64_t base = (n0 + k) * C;
        for (std::int64_t c = 0; c < C; ++c) {
          const float xhat = xr[k][c] * r[k];
          dx(base + c) = dfma(r[k], dfma(dr[k][c], F::load(w(c)), -(xhat * mean_dx[k])), dx(base + c));
        }
      }
    });
  }
  constexpr std::int64_t kCols = 64;
  const float *xd = x.data(), *dd = dout.data(), *rd = rstd.data();
  float* dwd = dw.data();
  Kokkos::parallel_for(
      "ops::rmsnorm_backward_params", range((C + kCols - 1) / kCols), KOKKOS_LAMBDA(std::int64_t blk) {
        const std::int64_t c0 = blk * kCols, c1 = c0 + kCols < C ? c0 + kCols : C;
        float sw[kCols] = {};
        for (std::int64_t n = 0; n < N; ++n) {
          const float r = rd[n];
          const float *xr = xd + n * C, *dr = dd + n * C;
          TRIDENT_SIMD
          for (std::int64_t c = c0; c < c1; ++c) sw[c - c0] = dfma(dr[c] * xr[c], r, sw[c - c0]);
        }
        for (std::int64_t c = c0; c < c1; ++c) dwd[c] += sw[c - c0];
      });
}

}  // namespace detail

void rmsnorm_forward(const Act& out, const FloatView& rstd, const FloatView& x, const Act& w, std::int64_t N,
                     std::int64_t C, float eps, const ResidualAdd& pre) {
  if (w.dt != out.dt) throw Error::one("internal: rmsnorm_forward with mixed storage types");
  if (out.dt == DType::F32)
    detail::rmsnorm_forward<F32Fmt>(out.f, rstd, x, w.f, N, C, eps, pre);
  else if (out.dt == DType::BF16)
    detail::rmsnorm_forward<Bf16Fmt>(out.h, rstd, x, w.h, N, C, eps, pre);
  else
    detail::rmsnorm_forward<Fp16Fmt>(out.h, rstd, x, w.h, N, C, eps, pre);
}

void rmsnorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& dout, const FloatView& x, const Act& w,
                      const FloatView& rstd, std::int64_t N, std::int64_t C) {
  if (w.dt == DType::F32)
    detail::rmsnorm_backward<F32Fmt>(dx, dw, dout, x, w.f, rstd, N, C);
  else if (w.dt == DType::BF16)
    detail::rmsnorm_backward<Bf16Fmt>(dx, dw, dout, x, w.h, rstd, N, C);
  else
    detail::rmsnorm_backward<Fp16Fmt>(dx, dw, dout, x, w.h, rstd, N, C);
}

}  // namespace trident
