// 16-bit twins of the fp32 ops: the same arithmetic, 16-bit loads and stores.
#include "ops/mixed_precision.hpp"

#include "common/device_math.hpp"
#include "common/error.hpp"
#include "common/simd.hpp"
#include "ops/gelu.hpp"

namespace trident {
namespace detail {


template <class F>
void pack(const HalfView& out, const FloatView& in, std::int64_t n) {
  Kokkos::parallel_for("ops::pack_half", range(n), KOKKOS_LAMBDA(std::int64_t i) { out(i) = F::store(in(i)); });
}
template <class F>
void unpack(const FloatView& out, const HalfView& in, std::int64_t n) {
  Kokkos::parallel_for("ops::unpack_half", range(n), KOKKOS_LAMBDA(std::int64_t i) { out(i) = F::load(in(i)); });
}
template <class F>
void add_bias_pack(const HalfView& out, const FloatView& y, const HalfView& bias, std::int64_t rows, std::int64_t cols) {
  Kokkos::parallel_for("ops::add_bias_pack_half", range(rows * cols),
                       KOKKOS_LAMBDA(std::int64_t i) { out(i) = F::store(y(i) + F::load(bias(i % cols))); });
}
template <class F>
void add_bias(const FloatView& y, const HalfView& bias, std::int64_t rows, std::int64_t cols) {
  Kokkos::parallel_for("ops::add_bias_half", range(rows * cols),
                       KOKKOS_LAMBDA(std::int64_t i) { y(i) += F::load(bias(i % cols)); });
}

template <class F>
void layernorm_forward(const HalfView& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
                       const HalfView& w, const HalfView& b, std::int64_t N, std::int64_t C, float eps) {
  Kokkos::parallel_for("ops::layernorm_forward_half", range(N), KOKKOS_LAMBDA(std::int64_t n) {
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
    for (std::int64_t c = 0; c < C; ++c) out(base + c) = F::store((x(base + c) - m) * r * F::load(w(c)) + F::load(b(c)));
    mean(n) = m;
    rstd(n) = r;
  });
}

template <class F>
void layernorm_backward(const FloatView& dx, const FloatView& dw, const FloatView& db, const FloatView& dout,
                        const FloatView& x, const HalfView& w, const FloatView& mean, const FloatView& rstd,
                        std::int64_t N, std::int64_t C) {
  Kokkos::parallel_for("ops::layernorm_backward_input_half", range(N), KOKKOS_LAMBDA(std::int64_t n) {
    const std::int64_t base = n * C;
    const float m = mean(n), r = rstd(n);
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
  // parameter gradients as in the fp32 op: one thread per block of channels, over the rows
  constexpr std::int64_t kCols = 64;
  const float *xd = x.data(), *dd = dout.data(), *md = mean.data(), *rd = rstd.data();
  float *dwd = dw.data(), *dbd = db.data();
  Kokkos::parallel_for("ops::layernorm_backward_params_half", range((C + kCols - 1) / kCols), KOKKOS_LAMBDA(std::int64_t blk) {
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

template <class F>
void gelu_forward(const HalfView& out, const HalfView& x, std::int64_t n) {
  Kokkos::parallel_for("ops::gelu_forward_half", range(n), KOKKOS_LAMBDA(std::int64_t i) {
    out(i) = F::store(gelu_tanh(F::load(x(i))));
  });
}

template <class F>
void gelu_backward(const FloatView& dx, const FloatView& dout, const HalfView& x, std::int64_t n) {
  Kokkos::parallel_for("ops::gelu_backward_half", range(n), KOKKOS_LAMBDA(std::int64_t i) {
    dx(i) = dout(i) * gelu_tanh_grad(F::load(x(i)));
  });
}

template <class F>
void embedding_lookup(const FloatView& out, const IntView& tokens, const HalfView& wte, std::int64_t start,
                      std::int64_t rows_local, std::int64_t N, std::int64_t C) {
  Kokkos::parallel_for("ops::embedding_lookup_half", range(N * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t n = i / C, c = i % C;
    const std::int64_t row = static_cast<std::int64_t>(tokens(n)) - start;
    out(i) = (row >= 0 && row < rows_local) ? F::load(wte(row * C + c)) : 0.f;
  });
}

template <class F>
void add_positions(const FloatView& x, const HalfView& wpe, std::int64_t row0, std::int64_t R, std::int64_t T,
                   std::int64_t C) {
  Kokkos::parallel_for("ops::add_positions_half", range(R * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t t = (row0 + i / C) % T;
    x(i) += F::load(wpe(t * C + i % C));
  });
}

}  // namespace detail

// One dispatch on the run-time type per call.
#define TRIDENT_HALF_CALL(dt, name, ...)                                                      \
  do {                                                                                        \
    if ((dt) == DType::BF16)                                                                  \
      detail::name<Bf16Fmt>(__VA_ARGS__);                                                     \
    else if ((dt) == DType::F16)                                                              \
      detail::name<Fp16Fmt>(__VA_ARGS__);                                                     \
    else                                                                                      \
      throw Error::one("internal: a 16-bit kernel was called with dtype fp32");               \
  } while (0)

void pack_half(DType dt, const HalfView& out, const FloatView& in, std::int64_t n) {
  TRIDENT_HALF_CALL(dt, pack, out, in, n);
}
void unpack_half(DType dt, const FloatView& out, const HalfView& in, std::int64_t n) {
  TRIDENT_HALF_CALL(dt, unpack, out, in, n);
}
void add_bias_pack_half(DType dt, const HalfView& out, const FloatView& y, const HalfView& bias, std::int64_t rows,
                        std::int64_t cols) {
  TRIDENT_HALF_CALL(dt, add_bias_pack, out, y, bias, rows, cols);
}
void add_bias_half(DType dt, const FloatView& y, const HalfView& bias, std::int64_t rows, std::int64_t cols) {
  TRIDENT_HALF_CALL(dt, add_bias, y, bias, rows, cols);
}
void layernorm_forward_half(DType dt, const HalfView& out, const FloatView& mean, const FloatView& rstd,
                            const FloatView& x, const HalfView& w, const HalfView& b, std::int64_t N, std::int64_t C,
                            float eps) {
  TRIDENT_HALF_CALL(dt, layernorm_forward, out, mean, rstd, x, w, b, N, C, eps);
}
void layernorm_backward_half(DType dt, const FloatView& dx, const FloatView& dw, const FloatView& db,
                             const FloatView& dout, const FloatView& x, const HalfView& w, const FloatView& mean,
                             const FloatView& rstd, std::int64_t N, std::int64_t C) {
  TRIDENT_HALF_CALL(dt, layernorm_backward, dx, dw, db, dout, x, w, mean, rstd, N, C);
}
void gelu_forward_half(DType dt, const HalfView& out, const HalfView& x, std::int64_t n) {
  TRIDENT_HALF_CALL(dt, gelu_forward, out, x, n);
}
void gelu_backward_half(DType dt, const FloatView& dx, const FloatView& dout, const HalfView& x, std::int64_t n) {
  TRIDENT_HALF_CALL(dt, gelu_backward, dx, dout, x, n);
}
void embedding_lookup_half(DType dt, const FloatView& out, const IntView& tokens, const HalfView& wte,
                           std::int64_t start, std::int64_t rows_local, std::int64_t N, std::int64_t C) {
  TRIDENT_HALF_CALL(dt, embedding_lookup, out, tokens, wte, start, rows_local, N, C);
}
void add_positions_half(DType dt, const FloatView& x, const HalfView& wpe, std::int64_t row0, std::int64_t R,
                        std::int64_t T, std::int64_t C) {
  TRIDENT_HALF_CALL(dt, add_positions, x, wpe, row0, R, T, C);
}

}  // namespace trident
