// The fused kernels of fused.hpp, one thread per element of (rows, cols), templated on the
// storage format (F32Fmt, Bf16Fmt, Fp16Fmt) and dispatched by DType. bias + GELU stores the
// rounded pre-activation and applies gelu_tanh to that stored value; bias + dropout + residual
// regenerates the mask with dropout_uniform(key, i) as dropout_forward does, so ops/dropout's
// backward matches it.
#include "ops/fused.hpp"

#include "common/device_math.hpp"
#include "common/host_parallel.hpp"
#include "ops/gelu.hpp"

namespace trident {
namespace detail {

template <class F, class V>
void bias_gelu(const V& pre, const V& out, const FloatView& y, const V& bias, std::int64_t rows, std::int64_t cols) {
  for_each_element(
      "ops::bias_gelu_forward", rows, cols, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        const auto stored = F::store(y(i) + F::load(bias(c)));
        pre(i) = stored;
        out(i) = F::store(gelu_tanh(F::load(stored)));
      });
}

template <class F, class V>
void bias_dropout_add(const FloatView& out, const FloatView& residual, const FloatView& branch, const V& bias,
                      std::int64_t rows, std::int64_t cols, DropoutSpec d) {
  const float p = d.p, scale = d.active() ? 1.f / (1.f - d.p) : 1.f;
  const std::uint64_t key = d.key;
  // The rounding is written out, so that it does not depend on what the compiler contracts: a
  // kept element is fma(v, scale, residual) (one rounding; the bits recorded by
  // validation/identity.py, where GCC used to contract residual + v * scale), a dropped one
  // residual + 0. Row by row with the column index, not i % cols, the loop vectorises (the
  // mask's 64-bit hash included): about 10x faster on the host than per element.
  if (!d.active()) {
    for_each_element(
        "ops::bias_dropout_add", rows, cols,
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) { out(i) = residual(i) + (branch(i) + F::load(bias(c))); });
    return;
  }
  for_each_element(
      "ops::bias_dropout_add", rows, cols, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        const float v = branch(i) + F::load(bias(c));
        const bool keep = dropout_uniform(key, static_cast<std::uint64_t>(i)) >= p;
        out(i) = keep ? dfma(v, scale, residual(i)) : residual(i) + 0.f;
      });
}

}  // namespace detail

void bias_gelu_forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
                       std::int64_t cols) {
  switch (pre.dt) {
    case DType::F32: detail::bias_gelu<F32Fmt>(pre.f, out.f, y, bias.f, rows, cols); break;
    case DType::BF16: detail::bias_gelu<Bf16Fmt>(pre.h, out.h, y, bias.h, rows, cols); break;
    case DType::F16: detail::bias_gelu<Fp16Fmt>(pre.h, out.h, y, bias.h, rows, cols); break;
  }
}

void bias_dropout_add(const FloatView& out, const FloatView& residual, const FloatView& branch, const Act& bias,
                      std::int64_t rows, std::int64_t cols, const DropoutSpec& d) {
  switch (bias.dt) {
    case DType::F32: detail::bias_dropout_add<F32Fmt>(out, residual, branch, bias.f, rows, cols, d); break;
    case DType::BF16: detail::bias_dropout_add<Bf16Fmt>(out, residual, branch, bias.h, rows, cols, d); break;
    case DType::F16: detail::bias_dropout_add<Fp16Fmt>(out, residual, branch, bias.h, rows, cols, d); break;
  }
}

}  // namespace trident
