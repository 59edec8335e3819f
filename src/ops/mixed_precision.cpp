// The conversion and bias kernels of mixed_precision.hpp (docs/DESIGN.md "Mixed precision"): one
// template per kernel over the storage format, dispatched once per call on the DType (Bf16Fmt or
// Fp16Fmt; fp32 is an internal error). Loads widen exactly, stores round to nearest even, and
// the 16-bit bias is widened and added in fp32.
#include "ops/mixed_precision.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "common/simd.hpp"
#include "ops/elementwise.hpp"

namespace trident {
namespace detail {

// Device kernels: 8 elements per thread, 16-byte loads and stores (for_each_vector)
template <class F>
void pack(const HalfView& out, const FloatView& in, std::int64_t n) {
  if constexpr (kDeviceKernels) {
    const float* src = in.data();
    std::uint16_t* dst = out.data();
    for_each_vector<8>(
        "ops::pack_half", n, aligned16(src) && aligned16(dst),
        KOKKOS_LAMBDA(std::int64_t i0) {
          const Pack<float, 4> a = load_pack<4>(src + i0), b = load_pack<4>(src + i0 + 4);
          Pack<std::uint16_t, 8> o;
          for (int k = 0; k < 4; ++k) {
            o.v[k] = F::store(a.v[k]);
            o.v[k + 4] = F::store(b.v[k]);
          }
          store_pack(dst + i0, o);
        },
        KOKKOS_LAMBDA(std::int64_t i) { dst[i] = F::store(src[i]); });
    return;
  }
  for_each_index(
      "ops::pack_half", n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = F::store(in(i)); });
}
template <class F>
void unpack(const FloatView& out, const HalfView& in, std::int64_t n) {
  if constexpr (kDeviceKernels) {
    const std::uint16_t* src = in.data();
    float* dst = out.data();
    for_each_vector<8>(
        "ops::unpack_half", n, aligned16(src) && aligned16(dst),
        KOKKOS_LAMBDA(std::int64_t i0) {
          const Pack<std::uint16_t, 8> h = load_pack<8>(src + i0);
          Pack<float, 4> a, b;
          for (int k = 0; k < 4; ++k) {
            a.v[k] = F::load(h.v[k]);
            b.v[k] = F::load(h.v[k + 4]);
          }
          store_pack(dst + i0, a);
          store_pack(dst + i0 + 4, b);
        },
        KOKKOS_LAMBDA(std::int64_t i) { dst[i] = F::load(src[i]); });
    return;
  }
  for_each_index(
      "ops::unpack_half", n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = F::load(in(i)); });
}
template <class F>
void add_bias_pack(const HalfView& out, const FloatView& y, const HalfView& bias, std::int64_t rows,
                   std::int64_t cols) {
  for_each_element(
      "ops::add_bias_pack_half", rows, cols,
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) { out(i) = F::store(y(i) + F::load(bias(c))); });
}

template <class F>
void bias_backward_pack(const FloatView& dbias, const HalfView& dy16, const FloatView& dy, std::int64_t rows,
                        std::int64_t cols) {
  if constexpr (kDeviceKernels) {
    const float* d = dy.data();
    std::uint16_t* h = dy16.data();
    // column_sums visits every (row, column) once, in its first kernel: the copy is written there
    column_sums<1>(
        "ops::bias_backward_pack_half", rows, cols,
        KOKKOS_LAMBDA(std::int64_t r, std::int64_t c, float* acc) {
          const float v = d[r * cols + c];
          h[r * cols + c] = F::store(v);
          acc[0] += v;
        },
        ColumnOut<1>{{dbias.data()}});
  } else {
    bias_backward(dbias, dy, rows, cols);
    pack<F>(dy16, dy, rows * cols);
  }
}

template <class F>
void bias_backward_of_half(const FloatView& dbias, const HalfView& dy16, std::int64_t rows, std::int64_t cols) {
  if constexpr (kDeviceKernels) {
    const std::uint16_t* h = dy16.data();
    column_sums<1>(
        "ops::bias_backward_half", rows, cols,
        KOKKOS_LAMBDA(std::int64_t r, std::int64_t c, float* acc) { acc[0] += F::load(h[r * cols + c]); },
        ColumnOut<1>{{dbias.data()}});
  } else {
    const FloatView dy = make_float("bias_backward_half::dy", rows * cols);
    unpack<F>(dy, dy16, rows * cols);
    bias_backward(dbias, dy, rows, cols);
  }
}

}  // namespace detail

// One dispatch on the run-time type per call.
#define TRIDENT_HALF_CALL(dt, name, ...)                                        \
  do {                                                                          \
    if ((dt) == DType::BF16)                                                    \
      detail::name<Bf16Fmt>(__VA_ARGS__);                                       \
    else if ((dt) == DType::F16)                                                \
      detail::name<Fp16Fmt>(__VA_ARGS__);                                       \
    else                                                                        \
      throw Error::one("internal: a 16-bit kernel was called with dtype fp32"); \
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
void bias_backward_pack_half(DType dt, const FloatView& dbias, const HalfView& dy16, const FloatView& dy,
                             std::int64_t rows, std::int64_t cols) {
  TRIDENT_HALF_CALL(dt, bias_backward_pack, dbias, dy16, dy, rows, cols);
}

void bias_backward_half(DType dt, const FloatView& dbias, const HalfView& dy16, std::int64_t rows, std::int64_t cols) {
  if (dbias.extent(0) == 0) return;
  TRIDENT_HALF_CALL(dt, bias_backward_of_half, dbias, dy16, rows, cols);
}

}  // namespace trident
