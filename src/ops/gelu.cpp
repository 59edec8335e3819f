// GELU forward and backward kernels (gelu.hpp): one template per direction over a storage format
// (F32Fmt, Bf16Fmt, Fp16Fmt of common/half.hpp: load to fp32, compute, round on store), used for
// fp32 views and, by DType, for bf16 / fp16 words; gradients are fp32 in every case.
#include "ops/gelu.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "ops/elementwise.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

namespace detail {
template <class F, class V>
void gelu_forward(const V& out, const V& x, std::int64_t n) {
  for_each_index(
      "ops::gelu_forward", n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = F::store(gelu_tanh(F::load(x(i)))); });
}
template <class F, class V>
void gelu_backward(const FloatView& dx, const FloatView& dout, const V& x, std::int64_t n) {
  for_each_index(
      "ops::gelu_backward", n, KOKKOS_LAMBDA(std::int64_t i) { dx(i) = dout(i) * gelu_tanh_grad(F::load(x(i))); });
}
template <class F>
void gelu_backward_pack(const HalfView& dx16, const FloatView& dbias, const FloatView& dout, const HalfView& x,
                        std::int64_t rows, std::int64_t cols) {
  const float* d = dout.data();
  const std::uint16_t* xs = x.data();
  std::uint16_t* h = dx16.data();
  if (dbias.extent(0) == 0) {
    for_each_index(
        "ops::gelu_backward_pack_half", rows * cols,
        KOKKOS_LAMBDA(std::int64_t i) { h[i] = F::store(d[i] * gelu_tanh_grad(F::load(xs[i]))); });
    return;
  }
  column_sums<1>(
      "ops::gelu_backward_pack_half", rows, cols,
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t c, float* acc) {
        const std::int64_t i = r * cols + c;
        const float v = d[i] * gelu_tanh_grad(F::load(xs[i]));
        h[i] = F::store(v);
        acc[0] += v;
      },
      ColumnOut<1>{{dbias.data()}});
}
}  // namespace detail

void gelu_forward(const Act& out, const Act& x, std::int64_t n) {
  if (out.dt != x.dt) throw Error::one("internal: gelu_forward with mixed storage types");
  if (x.dt == DType::F32)
    detail::gelu_forward<F32Fmt>(out.f, x.f, n);
  else if (x.dt == DType::BF16)
    detail::gelu_forward<Bf16Fmt>(out.h, x.h, n);
  else
    detail::gelu_forward<Fp16Fmt>(out.h, x.h, n);
}

void gelu_backward_pack_half(DType dt, const HalfView& dx16, const FloatView& dbias, const FloatView& dout,
                             const HalfView& x, std::int64_t rows, std::int64_t cols) {
  if constexpr (!kDeviceKernels) {  // the three kernels, their bits
    const FloatView dx = make_float("gelu::dx", rows * cols);
    gelu_backward(dx, dout, Act(dt, x), rows * cols);
    if (dbias.extent(0) > 0) bias_backward(dbias, dx, rows, cols);
    pack_half(dt, dx16, dx, rows * cols);
    return;
  }
  if (dt == DType::BF16)
    detail::gelu_backward_pack<Bf16Fmt>(dx16, dbias, dout, x, rows, cols);
  else if (dt == DType::F16)
    detail::gelu_backward_pack<Fp16Fmt>(dx16, dbias, dout, x, rows, cols);
  else
    throw Error::one("internal: gelu_backward_pack_half with dtype fp32");
}

void gelu_backward(const FloatView& dx, const FloatView& dout, const Act& x, std::int64_t n) {
  if (x.dt == DType::F32)
    detail::gelu_backward<F32Fmt>(dx, dout, x.f, n);
  else if (x.dt == DType::BF16)
    detail::gelu_backward<Bf16Fmt>(dx, dout, x.h, n);
  else
    detail::gelu_backward<Fp16Fmt>(dx, dout, x.h, n);
}

}  // namespace trident
