// Embedding lookup and its scatter-add backward.
#include "ops/embedding.hpp"

namespace trident {

void embedding_forward(const FloatView& out, const IntView& tokens, const FloatView& wte, const FloatView& wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C) {
  Kokkos::parallel_for("ops::embedding_forward", range(B * T * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t bt = i / C, c = i % C, t = bt % T;
    const std::int64_t tok = tokens(bt);
    out(i) = wte(tok * C + c) + wpe(t * C + c);
  });
}

void embedding_backward(const FloatView& dwte, const FloatView& dwpe, const FloatView& dout, const IntView& tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C) {
  // Position gradient: one thread per (t, c) sums over the batch (deterministic).
  Kokkos::parallel_for("ops::embedding_backward_pos", range(T * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t t = i / C, c = i % C;
    float s = 0.f;
    for (std::int64_t b = 0; b < B; ++b) s += dout((b * T + t) * C + c);
    dwpe(i) += s;
  });
  // Token gradient: one thread per channel walks the tokens in order, so repeated tokens are
  // summed in a fixed order (deterministic on every backend, no atomics).
  Kokkos::parallel_for("ops::embedding_backward_tok", range(C), KOKKOS_LAMBDA(std::int64_t c) {
    for (std::int64_t bt = 0; bt < B * T; ++bt) {
      const std::int64_t tok = tokens(bt);
      dwte(tok * C + c) += dout(bt * C + c);
    }
  });
}

}  // namespace trident
