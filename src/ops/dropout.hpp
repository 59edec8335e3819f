// Dropout with counter-based masks: element i of a call with key k is kept when
// u(k, i) >= p, for u a hash of (k, i) mapped to [0, 1). The mask is never stored: backward
// recomputes it from the same key. Keys follow Megatron's RNG convention (train/ and layers/
// derive them): one stream shared by all TP ranks outside tensor-parallel regions, a stream per
// TP rank inside them.
#pragma once
#include <functional>
#include <vector>

#include "common/types.hpp"

namespace trident {

struct DropoutSpec {
  float p = 0.f;          // drop probability; 0 disables
  std::uint64_t key = 0;  // stream key of this call
  bool active() const { return p > 0.f; }
  // Context parallelism (cp > 1): the call's rows (B x Tl tokens of a context-parallel rank,
  // from row row0 of them on) are the zig-zag chunks of ops/ring_attention.hpp, and an element's
  // counter is that of its place in the whole (B, T = Tl cp) rows, so that the masks do not
  // depend on cp. cp = 1: the counter is the element index.
  std::int64_t cp = 1, cp_rank = 0, Tl = 0, row0 = 0;
  bool mapped() const { return cp > 1; }
  // The fused attention kernel's probabilities under context parallelism over heads (a2a): the
  // call's heads are heads [head0, head0 + nh) of `heads` (0: the call's own nh), and each mask
  // element is that of its head among all of them (ops/flash_attention.cpp).
  std::int64_t head0 = 0, heads = 0;
  // the counter of element (i / cols, i % cols) of the call
  KOKKOS_INLINE_FUNCTION std::uint64_t counter(std::int64_t i, std::int64_t cols) const {
    const std::int64_t row = row0 + i / cols, c = i - (i / cols) * cols;
    const std::int64_t b = row / Tl, t = row - b * Tl, half = Tl / 2;
    const std::int64_t g = t < half ? cp_rank * half + t : (2 * cp - 1 - cp_rank) * half + (t - half);
    return static_cast<std::uint64_t>((b * Tl * cp + g) * cols + c);
  }
};

// u(key, i) in [0, 1): the counter-based uniform behind every mask (24 random bits). Element i
// of a call is kept when u(key, i) >= p; fused kernels regenerate masks with it.
KOKKOS_INLINE_FUNCTION float dropout_uniform(std::uint64_t key, std::uint64_t i) {
  std::uint64_t x = key ^ (i * 0x9E3779B97F4A7C15ull);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

// out = in * keep / (1 - p)   (out may alias in); a mapped spec (cp > 1) needs `cols`, the
// row length of the (n / cols, cols) elements
void dropout_forward(const FloatView& out, const FloatView& in, std::int64_t n, const DropoutSpec& d,
                     std::int64_t cols = 0);
// din = dout * keep / (1 - p) (din may alias dout)
void dropout_backward(const FloatView& din, const FloatView& dout, std::int64_t n, const DropoutSpec& d,
                      std::int64_t cols = 0);

// Validation (debug.dump_dropout): a recorder that sees every forward dropout call of the model,
// in call order, with its place (site name, layer; -1 for the embedding) and the shape the mask
// covers (row-major over the call's elements). None is installed by default; record_dropout is then
// a no-op, as it is for an inactive spec.
using DropoutRecorder = std::function<void(const char* site, std::int64_t layer, const DropoutSpec& d,
                                           const std::vector<std::int64_t>& shape)>;
void set_dropout_recorder(DropoutRecorder recorder);
void record_dropout(const char* site, std::int64_t layer, const DropoutSpec& d, const std::vector<std::int64_t>& shape);

// Key of one dropout call: a pure function of its parts (see DropoutSpec).
std::uint64_t dropout_key(std::uint64_t stream, std::uint64_t step, std::uint64_t layer, std::uint64_t site);

}  // namespace trident
