// Dropout kernels.
#include "ops/dropout.hpp"

#include "common/rng.hpp"

namespace trident {

namespace {
KOKKOS_INLINE_FUNCTION float uniform01(std::uint64_t key, std::uint64_t i) {
  std::uint64_t x = key ^ (i * 0x9E3779B97F4A7C15ull);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // 24 random bits
}
void apply(const char* label, const FloatView& out, const FloatView& in, std::int64_t n, const DropoutSpec& d) {
  if (!d.active()) {
    if (out.data() != in.data()) Kokkos::deep_copy(slice(out, 0, n), slice(in, 0, n));
    return;
  }
  const float p = d.p, scale = 1.f / (1.f - d.p);
  const std::uint64_t key = d.key;
  Kokkos::parallel_for(label, range(n), KOKKOS_LAMBDA(std::int64_t i) {
    out(i) = uniform01(key, static_cast<std::uint64_t>(i)) >= p ? in(i) * scale : 0.f;
  });
}
}  // namespace

void dropout_forward(const FloatView& out, const FloatView& in, std::int64_t n, const DropoutSpec& d) {
  apply("ops::dropout_forward", out, in, n, d);
}

void dropout_backward(const FloatView& din, const FloatView& dout, std::int64_t n, const DropoutSpec& d) {
  apply("ops::dropout_backward", din, dout, n, d);
}

std::uint64_t dropout_key(std::uint64_t stream, std::uint64_t step, std::uint64_t layer, std::uint64_t site) {
  std::uint64_t k = splitmix64(stream);
  k = splitmix64(k ^ step);
  k = splitmix64(k ^ (layer * 16 + site));
  return k;
}

}  // namespace trident
