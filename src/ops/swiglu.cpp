// SwiGLU kernels (swiglu.hpp), one thread per element of the (rows, F) activation over the rank's
// host threads (common/host_parallel), templated on the storage format and dispatched by DType.
#include "ops/swiglu.hpp"

#include "common/error.hpp"
#include "common/host_parallel.hpp"

namespace trident {
namespace detail {

template <class F, class V>
void bias_swiglu(const V& pre, const V& out, const FloatView& y, const V& bias, std::int64_t rows, std::int64_t Fc) {
  for_each_element(
      "ops::bias_swiglu_forward", rows, Fc, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        const std::int64_t g = (i - c) * 2 + c, u = g + Fc;  // row r = i / Fc: pre[r, c], pre[r, Fc + c]
        const auto sg = F::store(y(g) + F::load(bias(c)));
        const auto su = F::store(y(u) + F::load(bias(Fc + c)));
        pre(g) = sg;
        pre(u) = su;
        out(i) = F::store(silu(F::load(sg)) * F::load(su));
      });
}

template <class F, class V>
void swiglu_grad(const FloatView& dpre, const FloatView& dout, const V& pre, std::int64_t rows, std::int64_t Fc) {
  for_each_element(
      "ops::swiglu_backward", rows, Fc, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        const std::int64_t g = (i - c) * 2 + c, u = g + Fc;
        const float vg = F::load(pre(g)), vu = F::load(pre(u)), d = dout(i);
        dpre(g) = d * vu * silu_grad(vg);
        dpre(u) = d * silu(vg);
      });
}

template <class F>
void swiglu_grad_pack(const HalfView& dpre, const FloatView& dout, const HalfView& pre, std::int64_t rows,
                      std::int64_t Fc) {
  for_each_element(
      "ops::swiglu_backward_pack_half", rows, Fc, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        const std::int64_t g = (i - c) * 2 + c, u = g + Fc;
        const float vg = F::load(pre(g)), vu = F::load(pre(u)), d = dout(i);
        dpre(g) = F::store(d * vu * silu_grad(vg));
        dpre(u) = F::store(d * silu(vg));
      });
}

}  // namespace detail

void bias_swiglu_forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
                         std::int64_t F) {
  if (pre.dt != out.dt || pre.dt != bias.dt) throw Error::one("internal: bias_swiglu_forward with mixed storage types");
  switch (pre.dt) {
    case DType::F32: detail::bias_swiglu<F32Fmt>(pre.f, out.f, y, bias.f, rows, F); break;
    case DType::BF16: detail::bias_swiglu<Bf16Fmt>(pre.h, out.h, y, bias.h, rows, F); break;
    case DType::F16: detail::bias_swiglu<Fp16Fmt>(pre.h, out.h, y, bias.h, rows, F); break;
  }
}

void swiglu_backward(const FloatView& dpre, const FloatView& dout, const Act& pre, std::int64_t rows, std::int64_t F) {
  switch (pre.dt) {
    case DType::F32: detail::swiglu_grad<F32Fmt>(dpre, dout, pre.f, rows, F); break;
    case DType::BF16: detail::swiglu_grad<Bf16Fmt>(dpre, dout, pre.h, rows, F); break;
    case DType::F16: detail::swiglu_grad<Fp16Fmt>(dpre, dout, pre.h, rows, F); break;
  }
}

void swiglu_backward_pack_half(DType dt, const HalfView& dpre16, const FloatView& dout, const HalfView& pre,
                               std::int64_t rows, std::int64_t F) {
  if (dt == DType::BF16)
    detail::swiglu_grad_pack<Bf16Fmt>(dpre16, dout, pre, rows, F);
  else if (dt == DType::F16)
    detail::swiglu_grad_pack<Fp16Fmt>(dpre16, dout, pre, rows, F);
  else
    throw Error::one("internal: swiglu_backward_pack_half with dtype fp32");
}

void swiglu_forward(const FloatView& out, const FloatView& pre, std::int64_t rows, std::int64_t Fc) {
  for_each_element(
      "ops::swiglu_forward", rows, Fc, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        const std::int64_t g = (i - c) * 2 + c;
        out(i) = silu(pre(g)) * pre(g + Fc);
      });
}

}  // namespace trident
