// GELU forward and backward kernels (gelu.hpp): one template per direction over a storage format
// (F32Fmt, Bf16Fmt, Fp16Fmt of common/half.hpp: load to fp32, compute, round on store), used for
// fp32 views and, by DType, for bf16 / fp16 words; gradients are fp32 in every case.
#include "ops/gelu.hpp"

#include "common/device_math.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"

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

void gelu_backward(const FloatView& dx, const FloatView& dout, const Act& x, std::int64_t n) {
  if (x.dt == DType::F32)
    detail::gelu_backward<F32Fmt>(dx, dout, x.f, n);
  else if (x.dt == DType::BF16)
    detail::gelu_backward<Bf16Fmt>(dx, dout, x.h, n);
  else
    detail::gelu_backward<Fp16Fmt>(dx, dout, x.h, n);
}

}  // namespace trident
