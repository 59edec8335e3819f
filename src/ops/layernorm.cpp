// LayerNorm forward/backward. One thread per row for the row-wise parts, one thread per
// channel for the parameter gradients (deterministic, no atomics).
#include "ops/layernorm.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "common/host_parallel.hpp"
#include "common/simd.hpp"

namespace trident {

namespace detail {

// F: storage format of out, w, b (F32Fmt: fp32 views; Bf16Fmt / Fp16Fmt: 16-bit words); x, the
// statistics and every gradient are fp32.
template <class F, class VO, class VW>
void layernorm_forward(const VO& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, const VW& w,
                       const VW& b, std::int64_t N, std::int64_t C, float eps) {
  if constexpr (kDeviceKernels) {  // a team per row (common/device_parallel.hpp)
    for_each_row(
        "ops::layernorm_forward", N, C, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
          const std::int64_t base = n * C;
          const float m = team_sum(t, C, [&](std::int64_t c) { return x(base + c); }) / C;
          const float v = team_sum(t, C,
                                   [&](std::int64_t c) {
                                     const float d = x(base + c) - m;
                                     return d * d;
                                   }) /
                          C;
          const float r = 1.f / dsqrt(v + eps);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, C), [&](std::int64_t c) {
            out(base + c) = F::store((x(base + c) - m) * r * F::load(w(c)) + F::load(b(c)));
          });
          Kokkos::single(Kokkos::PerTeam(t), [&]() {
            mean(n) = m;
            rstd(n) = r;
          });
        });
    return;
  }
  for_each_index(
      "ops::layernorm_forward", N, KOKKOS_LAMBDA(std::int64_t n) {
        const std::int64_t base = n * C;
        float m = 0.f;
        for (std::int64_t c = 0; c < C; ++c) m += x(base + c);
        m /= C;
        float v = 0.f;
        for (std::int64_t c = 0; c < C; ++c) {
          const float d = x(base + c) - m;
          v += d * d;
        }
        v /= C;
        const float r = 1.f / dsqrt(v + eps);
        for (std::int64_t c = 0; c < C; ++c)
          out(base + c) = F::store((x(base + c) - m) * r * F::load(w(c)) + F::load(b(c)));
        mean(n) = m;
        rstd(n) = r;
      });
}

template <class F, class VW>
void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const VW& w, const FloatView& mean, const FloatView& rstd, std::int64_t N,
                        std::int64_t C) {
  if constexpr (kDeviceKernels) {  // a team per row (common/device_parallel.hpp)
    for_each_row(
        "ops::layernorm_backward_input", N, C, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
          const std::int64_t base = n * C;
          const float m = mean(n), r = rstd(n);
          const float mean_d = team_sum(t, C, [&](std::int64_t c) { return dout(base + c) * F::load(w(c)); }) / C;
          const float mean_dx = team_sum(t, C,
                                         [&](std::int64_t c) {
                                           return dout(base + c) * F::load(w(c)) * ((x(base + c) - m) * r);
                                         }) /
                                C;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, C), [&](std::int64_t c) {
            const float xhat = (x(base + c) - m) * r;
            const float dn = dout(base + c) * F::load(w(c));
            dx(base + c) += r * (dn - mean_d - xhat * mean_dx);
          });
        });
  } else {
    for_each_index(
        "ops::layernorm_backward_input", N, KOKKOS_LAMBDA(std::int64_t n) {
          const std::int64_t base = n * C;
          const float m = mean(n), r = rstd(n);
          // dnorm = dout * w;  dx = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
          float mean_d = 0.f, mean_dx = 0.f;
          for (std::int64_t c = 0; c < C; ++c) {
            const float xhat = (x(base + c) - m) * r;
            const float dn = dout(base + c) * F::load(w(c));
            mean_d += dn;
            mean_dx += dn * xhat;
          }
          mean_d /= C;
          mean_dx /= C;
          for (std::int64_t c = 0; c < C; ++c) {
            const float xhat = (x(base + c) - m) * r;
            const float dn = dout(base + c) * F::load(w(c));
            dx(base + c) += r * (dn - mean_d - xhat * mean_dx);
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
  if constexpr (kDeviceKernels) {  // a GPU: one thread per (part of the rows, channel)
    column_sums<2>(
        "ops::layernorm_backward_params", N, C,
        KOKKOS_LAMBDA(std::int64_t n, std::int64_t c, float* acc) {
          const float d = dd[n * C + c];
          acc[0] += d * (xd[n * C + c] - md[n]) * rd[n];
          acc[1] += d;
        },
        ColumnOut<2>{{dwd, dbd}});
    return;
  }
  Kokkos::parallel_for(
      "ops::layernorm_backward_params", range((C + kCols - 1) / kCols), KOKKOS_LAMBDA(std::int64_t blk) {
        const std::int64_t c0 = blk * kCols, c1 = c0 + kCols < C ? c0 + kCols : C;
        float sw[kCols] = {}, sb[kCols] = {};
        for (std::int64_t n = 0; n < N; ++n) {
          const float m = md[n], r = rd[n];
          const float *xr = xd + n * C, *dr = dd + n * C;
          TRIDENT_SIMD
          for (std::int64_t c = c0; c < c1; ++c) {
            sw[c - c0] += dr[c] * (xr[c] - m) * r;
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
                       const Act& b, std::int64_t N, std::int64_t C, float eps) {
  if (w.dt != out.dt || b.dt != out.dt) throw Error::one("internal: layernorm_forward with mixed storage types");
  if (out.dt == DType::F32)
    detail::layernorm_forward<F32Fmt>(out.f, mean, rstd, x, w.f, b.f, N, C, eps);
  else if (out.dt == DType::BF16)
    detail::layernorm_forward<Bf16Fmt>(out.h, mean, rstd, x, w.h, b.h, N, C, eps);
  else
    detail::layernorm_forward<Fp16Fmt>(out.h, mean, rstd, x, w.h, b.h, N, C, eps);
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
