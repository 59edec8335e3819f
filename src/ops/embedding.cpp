// Embedding lookups and their backward passes. Every backward adds a table row's contributions in
// row order, one channel per thread, without atomics: deterministic on every backend, and the same
// bits on every backend. The host kernels give one thread per channel and walk all the rows; the
// device kernels (kDeviceKernels) start one thread per (table row, channel) that walks only that
// row's contributions, found through the rows' order by key that the host computed when it staged
// the micro-batch (MicroBatch::token_order), or, for positions p(row) = row % T, by stepping T rows.
#include "ops/embedding.hpp"

#include "common/device_parallel.hpp"
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

namespace {
// dtable[key(n) - start] += src[n - first_row] over the runs of equal keys in `order` (rows n sorted
// by key, ties by n), for the rows n in [first_row, first_row + num_rows): one thread per (order
// entry, channel), working only at the first entry of its key's run, which it walks.
template <class Key>
void bucketed_backward(const char* name, const FloatView& dtable, const FloatView& src, const IntView& order,
                       std::int64_t N, std::int64_t C, const Key& key, std::int64_t start, std::int64_t rows_local,
                       std::int64_t first_row, std::int64_t num_rows) {
  for_each_index(
      name, N * C, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t k = i / C, c = i % C;
        const std::int64_t id = key(order(k));
        if (k > 0 && key(order(k - 1)) == id) return;  // not the run's first entry
        const std::int64_t row = id - start;
        if (row < 0 || row >= rows_local) return;
        float acc = dtable(row * C + c);
        bool any = false;
        for (std::int64_t j = k; j < N && key(order(j)) == id; ++j) {
          const std::int64_t n = order(j) - first_row;
          if (n < 0 || n >= num_rows) continue;
          acc += src(n * C + c);
          any = true;
        }
        if (any) dtable(row * C + c) = acc;
      });
}
}  // namespace

void embedding_lookup_backward(const FloatView& dwte, const FloatView& dout, const IntView& tokens, std::int64_t start,
                               std::int64_t rows_local, std::int64_t N, std::int64_t C, const IntView& order) {
  if constexpr (kDeviceKernels) {
    if (static_cast<std::int64_t>(order.extent(0)) == N) {
      bucketed_backward(
          "ops::embedding_lookup_backward", dwte, dout, order, N, C,
          KOKKOS_LAMBDA(std::int64_t n) { return static_cast<std::int64_t>(tokens(n)); }, start, rows_local, 0, N);
      return;
    }
  }
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
                            std::int64_t T, std::int64_t C, const IntView& positions, const IntView& order) {
  const bool given = positions.extent(0) > 0;
  if constexpr (kDeviceKernels) {
    if (!given) {  // position t gathers the local rows ((t - row0) mod T) + m T, in order
      for_each_index(
          "ops::add_positions_backward", T * C, KOKKOS_LAMBDA(std::int64_t i) {
            const std::int64_t t = i / C, c = i % C;
            float acc = dwpe(t * C + c);
            bool any = false;
            for (std::int64_t r = ((t - row0) % T + T) % T; r < R; r += T) {
              acc += dx(r * C + c);
              any = true;
            }
            if (any) dwpe(t * C + c) = acc;
          });
      return;
    }
    const std::int64_t N = static_cast<std::int64_t>(positions.extent(0));
    if (static_cast<std::int64_t>(order.extent(0)) == N) {
      bucketed_backward(
          "ops::add_positions_backward", dwpe, dx, order, N, C,
          KOKKOS_LAMBDA(std::int64_t n) { return static_cast<std::int64_t>(positions(n)); }, 0,
          static_cast<std::int64_t>(dwpe.extent(0)) / C, row0, R);
      return;
    }
  }
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
