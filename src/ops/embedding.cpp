// Embedding lookups and their backward passes. Backward kernels give one thread per channel
// and walk the rows in order, so repeated tokens/positions are summed in a fixed order
// (deterministic on every backend, no atomics).
#include "ops/embedding.hpp"
#include "common/host_parallel.hpp"

namespace trident {

namespace detail {
template <class F, class V>
void embedding_lookup(const FloatView& out, const IntView& tokens, const V& wte, std::int64_t start,
                      std::int64_t rows_local, std::int64_t N, std::int64_t C) {
  for_each_index(
      "ops::embedding_lookup", N * C, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t n = i / C, c = i % C;
        const std::int64_t row = static_cast<std::int64_t>(tokens(n)) - start;
        out(i) = (row >= 0 && row < rows_local) ? F::load(wte(row * C + c)) : 0.f;
      });
}
template <class F, class V>
void add_positions(const FloatView& x, const V& wpe, std::int64_t row0, std::int64_t R, std::int64_t T, std::int64_t C,
                   const IntView& positions) {
  const bool given = positions.extent(0) > 0;
  for_each_index(
      "ops::add_positions", R * C, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t row = row0 + i / C;
        const std::int64_t t = given ? static_cast<std::int64_t>(positions(row)) : row % T;
        x(i) += F::load(wpe(t * C + i % C));
      });
}
}  // namespace detail

void embedding_lookup(const FloatView& out, const IntView& tokens, const Act& wte, std::int64_t start,
                      std::int64_t rows_local, std::int64_t N, std::int64_t C) {
  if (wte.dt == DType::F32)
    detail::embedding_lookup<F32Fmt>(out, tokens, wte.f, start, rows_local, N, C);
  else if (wte.dt == DType::BF16)
    detail::embedding_lookup<Bf16Fmt>(out, tokens, wte.h, start, rows_local, N, C);
  else
    detail::embedding_lookup<Fp16Fmt>(out, tokens, wte.h, start, rows_local, N, C);
}

void embedding_lookup_backward(const FloatView& dwte, const FloatView& dout, const IntView& tokens, std::int64_t start,
                               std::int64_t rows_local, std::int64_t N, std::int64_t C) {
  for_each_index(
      "ops::embedding_lookup_backward", C, KOKKOS_LAMBDA(std::int64_t c) {
        for (std::int64_t n = 0; n < N; ++n) {
          const std::int64_t row = static_cast<std::int64_t>(tokens(n)) - start;
          if (row >= 0 && row < rows_local) dwte(row * C + c) += dout(n * C + c);
        }
      });
}

void add_positions(const FloatView& x, const Act& wpe, std::int64_t row0, std::int64_t R, std::int64_t T,
                   std::int64_t C, const IntView& positions) {
  if (wpe.dt == DType::F32)
    detail::add_positions<F32Fmt>(x, wpe.f, row0, R, T, C, positions);
  else if (wpe.dt == DType::BF16)
    detail::add_positions<Bf16Fmt>(x, wpe.h, row0, R, T, C, positions);
  else
    detail::add_positions<Fp16Fmt>(x, wpe.h, row0, R, T, C, positions);
}

void add_positions_backward(const FloatView& dwpe, const FloatView& dx, std::int64_t row0, std::int64_t R,
                            std::int64_t T, std::int64_t C, const IntView& positions) {
  const bool given = positions.extent(0) > 0;
  for_each_index(
      "ops::add_positions_backward", C, KOKKOS_LAMBDA(std::int64_t c) {
        for (std::int64_t i = 0; i < R; ++i) {
          const std::int64_t t = given ? static_cast<std::int64_t>(positions(row0 + i)) : (row0 + i) % T;
          dwpe(t * C + c) += dx(i * C + c);
        }
      });
}

void embedding_forward(const FloatView& out, const IntView& tokens, const FloatView& wte, const FloatView& wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C) {
  embedding_lookup(out, tokens, wte, 0, static_cast<std::int64_t>(wte.extent(0)) / C, B * T, C);
  add_positions(out, wpe, 0, B * T, T, C);
}

void embedding_backward(const FloatView& dwte, const FloatView& dwpe, const FloatView& dout, const IntView& tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C) {
  add_positions_backward(dwpe, dout, 0, B * T, T, C);
  embedding_lookup_backward(dwte, dout, tokens, 0, static_cast<std::int64_t>(dwte.extent(0)) / C, B * T, C);
}

}  // namespace trident
