// LayerNorm forward/backward. One thread per row for the row-wise parts, one thread per
// channel for the parameter gradients (deterministic, no atomics).
#include "ops/layernorm.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "common/host_parallel.hpp"
#include "common/simd.hpp"
#include "ops/fused.hpp"

namespace trident {

namespace detail {

// The host kernels: this file is compiled with -ffp-contract=off for the host (src/CMakeLists.txt),
// and every fused multiply-add is spelled dfma, so that the bits do not depend on how the compiler
// vectorises a loop (a row's sums side by side with other rows' or alone, a loop's vector body or
// its remainder): the sums add rounded products in order; the element-wise updates fuse where
// GCC's contraction of the earlier source fused them in its vector loops, so rows whose width is
// a multiple of the vector length keep their earlier bits (validation/identity.py).
// Rows per host task: their sequential sums (each an add chain, one add per add latency) run side
// by side, so the row-wise kernels run at the adders' throughput rather than their latency.
constexpr int kRowBlock = 8;

// x̂·w + b as the earlier loops rounded it: one rounding (GCC fused it in their vector loops) for
// fp32 and bf16 outputs, two for fp16, whose scalar loop with its branching conversion added the
// rounded product.
template <class F>
inline float affine(float xhat, float w, float b) {
  if constexpr (std::is_same_v<F, Fp16Fmt>)
    return xhat * w + b;
  else
    return dfma(xhat, w, b);
}

// F: storage format of out, w, b (F32Fmt: fp32 views; Bf16Fmt / Fp16Fmt: 16-bit words); x, the
// statistics and every gradient are fp32.
template <class F, class VO, class VW>
void layernorm_forward(const VO& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, const VW& w,
                       const VW& b, std::int64_t N, std::int64_t C, float eps, const ResidualAdd& pre) {
  if constexpr (kDeviceKernels) {  // a warp per row, 16-byte groups (common/device_parallel.hpp)
    const ResidualRow<F, VW> add(pre);
    const float* xd = x.data();
    auto* od = out.data();
    const auto *wd = w.data(), *bd = b.data();
    const bool packed = rows_packed(C, xd, od, wd, bd) && add.packed(C);
    for_each_row(
        add.on ? "ops::residual_layernorm_forward" : "ops::layernorm_forward", N,
        KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
          const std::int64_t base = n * C;
          add(t, x, base, C, packed);
          const float m = row_sum_values<F32Fmt>(t, C, xd + base, packed, [](float v) { return v; }) / C;
          const float var = row_sum_values<F32Fmt>(t, C, xd + base, packed,
                                                   [&](float v) { return (v - m) * (v - m); }) /
                            C;
          const float r = 1.f / dsqrt(var + eps);
          row_for_groups(t, C, [&](std::int64_t c0, int cnt) {
            float v[kGroup], wv[kGroup], bv[kGroup];
            load_group<F32Fmt>(xd + base + c0, cnt, packed, v);
            load_group<F>(wd + c0, cnt, packed, wv);
            load_group<F>(bd + c0, cnt, packed, bv);
            for (int k = 0; k < kGroup; ++k) v[k] = (v[k] - m) * r * wv[k] + bv[k];
            store_group<F>(od + base + c0, cnt, packed, v);
          });
          row_once(t, [&]() {
            mean(n) = m;
            rstd(n) = r;
          });
        });
  } else {
    if (pre.on()) bias_dropout_add(x, pre.residual, pre.branch, pre.bias, N, C, pre.d);
    // the host: kRowBlock rows at a time, their sums side by side (each row's as a row alone)
    const float* xd = x.data();
    for_each_row_block<kRowBlock>("ops::layernorm_forward", N, [=](auto rows, std::int64_t n0) {
      constexpr int R = decltype(rows)::value;
      const float* xr[R];
      float m[R], v[R], r[R];
      for (int k = 0; k < R; ++k) {
        xr[k] = xd + (n0 + k) * C;
        m[k] = 0.f;
        v[k] = 0.f;
      }
      for (std::int64_t c = 0; c < C; ++c)
        for (int k = 0; k < R; ++k) m[k] += xr[k][c];
      for (int k = 0; k < R; ++k) m[k] /= C;
      for (std::int64_t c = 0; c < C; ++c)
        for (int k = 0; k < R; ++k) {
          const float d = xr[k][c] - m[k];
          v[k] += d * d;
        }
      for (int k = 0; k < R; ++k) {
        v[k] /= C;
        r[k] = 1.f / dsqrt(v[k] + eps);
      }
      for (int k = 0; k < R; ++k) {
        const std::int64_t base = (n0 + k) * C;
        for (std::int64_t c = 0; c < C; ++c)
          out(base + c) = F::store(affine<F>((xr[k][c] - m[k]) * r[k], F::load(w(c)), F::load(b(c))));
        mean(n0 + k) = m[k];
        rstd(n0 + k) = r[k];
      }
    });
  }
}

template <class F, class VW>
void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const VW& w, const FloatView& mean, const FloatView& rstd, std::int64_t N,
                        std::int64_t C) {
  if constexpr (kDeviceKernels) {
    // a team per part of the rows: each row's input gradient (a warp per row, 16-byte groups), and
    // the weight and bias gradients' sums of the same rows, in one kernel (common/device_parallel.hpp)
    const float *xd = x.data(), *dd = dout.data(), *md = mean.data(), *rd = rstd.data();
    float* dxd = dx.data();
    const auto* wd = w.data();
    const bool packed = rows_packed(C, xd, dd, dxd, wd);
    rows_with_column_sums<2>(
        "ops::layernorm_backward", N, C,
        KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
          const std::int64_t base = n * C;
          const float m = mean(n), r = rstd(n);
          // dn = dout w: the row's means of dn and of dn xhat
          const float mean_d = norm_row_sum<F>(t, C, base, packed, dd, wd, xd, [](float dn, float) { return dn; }) / C;
          const float mean_dx = norm_row_sum<F>(t, C, base, packed, dd, wd, xd,
                                                [&](float dn, float xv) { return dn * ((xv - m) * r); }) /
                                C;
          norm_row_add<F>(t, C, base, packed, dd, wd, xd, dxd,
                          [&](float dn, float xv) { return r * (dn - mean_d - (xv - m) * r * mean_dx); });
        },
        KOKKOS_LAMBDA(std::int64_t n, std::int64_t c, float* acc) {
          const float d = dd[n * C + c];
          acc[0] += d * (xd[n * C + c] - md[n]) * rd[n];
          acc[1] += d;
        },
        ColumnOut<2>{{dw.data(), db.data()}});
    return;
  } else {
    // the host: kRowBlock rows at a time, their sums side by side (each row's as a row alone)
    const float *xd = x.data(), *dd = dout.data();
    for_each_row_block<kRowBlock>("ops::layernorm_backward_input", N, [=](auto rows, std::int64_t n0) {
      constexpr int R = decltype(rows)::value;
      // dnorm = dout * w;  dx = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
      const float *xr[R], *dr[R];
      float m[R], r[R], mean_d[R], mean_dx[R];
      for (int k = 0; k < R; ++k) {
        xr[k] = xd + (n0 + k) * C;
        dr[k] = dd + (n0 + k) * C;
        m[k] = mean(n0 + k);
        r[k] = rstd(n0 + k);
        mean_d[k] = 0.f;
        mean_dx[k] = 0.f;
      }
      for (std::int64_t c = 0; c < C; ++c) {
        const float wc = F::load(w(c));
        for (int k = 0; k < R; ++k) {
          const float xhat = (xr[k][c] - m[k]) * r[k];
          const float dn = dr[k][c] * wc;
          mean_d[k] += dn;
          mean_dx[k] += dn * xhat;
        }
      }
      for (int k = 0; k < R; ++k) {
        mean_d[k] /= C;
        mean_dx[k] /= C;
        const std::int64_t base = (n0 + k) * C;
        for (std::int64_t c = 0; c < C; ++c) {
          const float xhat = (xr[k][c] - m[k]) * r[k];
          const float t = dfma(dr[k][c], F::load(w(c)), -mean_d[k]);  // dn - mean(dnorm)
          dx(base + c) = dfma(r[k], dfma(-xhat, mean_dx[k], t), dx(base + c));
        }
      }
    });
  }
  // Parameter gradients: one thread per block of kCols channels walks the rows (contiguous,
  // vectorised segments; deterministic, no atomics).
  constexpr std::int64_t kCols = 64;
  const float *xd = x.data(), *dd = dout.data(), *md = mean.data(), *rd = rstd.data();
  float *dwd = dw.data(), *dbd = db.data();
  // Kokkos' own dispatch, not common/host_parallel: with C / 64 blocks (12 at C = 768) the host
  // threads made it slower (GPT-2 124M: 24-54 us per call on one thread, 168-215 us on two), so it
  // stays on one thread under a Serial Kokkos.
  Kokkos::parallel_for(
      "ops::layernorm_backward_params", range((C + kCols - 1) / kCols), KOKKOS_LAMBDA(std::int64_t blk) {
        const std::int64_t c0 = blk * kCols, c1 = c0 + kCols < C ? c0 + kCols : C;
        float sw[kCols] = {}, sb[kCols] = {};
        for (std::int64_t n = 0; n < N; ++n) {
          const float m = md[n], r = rd[n];
          const float *xr = xd + n * C, *dr = dd + n * C;
          TRIDENT_SIMD
          for (std::int64_t c = c0; c < c1; ++c) {
            sw[c - c0] = dfma(dr[c] * (xr[c] - m), r, sw[c - c0]);
            sb[c - c0] += dr[c];
          }
        }
        for (std::int64_t c = c0; c < c1; ++c) {
          dwd[c] += sw[c - c0];
          dbd[c] += sb[c - c0];
        }
      });
}

}  // namespace detail

void layernorm_forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, const Act& w,
                       const Act& b, std::int64_t N, std::int64_t C, float eps, const ResidualAdd& pre) {
  if (w.dt != out.dt || b.dt != out.dt) throw Error::one("internal: layernorm_forward with mixed storage types");
  if (out.dt == DType::F32)
    detail::layernorm_forward<F32Fmt>(out.f, mean, rstd, x, w.f, b.f, N, C, eps, pre);
  else if (out.dt == DType::BF16)
    detail::layernorm_forward<Bf16Fmt>(out.h, mean, rstd, x, w.h, b.h, N, C, eps, pre);
  else
    detail::layernorm_forward<Fp16Fmt>(out.h, mean, rstd, x, w.h, b.h, N, C, eps, pre);
}

void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const Act& w, const FloatView& mean, const FloatView& rstd, std::int64_t N,
                        std::int64_t C) {
  if (w.dt == DType::F32)
    detail::layernorm_backward<F32Fmt>(dx, dw, db, dout, x, w.f, mean, rstd, N, C);
  else if (w.dt == DType::BF16)
    detail::layernorm_backward<Bf16Fmt>(dx, dw, db, dout, x, w.h, mean, rstd, N, C);
  else
    detail::layernorm_backward<Fp16Fmt>(dx, dw, db, dout, x, w.h, mean, rstd, N, C);
}

}  // namespace trident
