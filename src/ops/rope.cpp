// Rotary position embedding (rope.hpp): the frequencies and the table on the host in double, the
// turns one thread per row over the rank's host threads (common/host_parallel).
#include "ops/rope.hpp"

#include <cmath>

#include "common/error.hpp"
#include "common/host_parallel.hpp"

namespace trident {

std::vector<double> rope_inv_freq(const RopeFrequencies& f) {
  TRIDENT_REQUIRE(f.rot > 0 && f.rot % 2 == 0, "internal: rotary channels " << f.rot << " must be even and > 0");
  const std::int64_t h = f.rot / 2;
  std::vector<double> inv(static_cast<size_t>(h));
  const double pi = 3.14159265358979323846;
  for (std::int64_t c = 0; c < h; ++c) {
    double v = std::pow(f.base, -2.0 * static_cast<double>(c) / static_cast<double>(f.rot));
    if (f.scaling) {  // Llama 3.1: long wavelengths / factor, short kept, a smooth blend between
      const double wavelen = 2.0 * pi / v;
      const double low_wavelen = f.original_max_positions / f.low_freq_factor;
      const double high_wavelen = f.original_max_positions / f.high_freq_factor;
      if (wavelen > low_wavelen) {
        v = v / f.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (f.original_max_positions / wavelen - f.low_freq_factor) /
                              (f.high_freq_factor - f.low_freq_factor);
        v = (1.0 - smooth) * v / f.factor + smooth * v;
      }
    }
    inv[static_cast<size_t>(c)] = v;
  }
  return inv;
}

RopeTable make_rope_table(const RopeFrequencies& f, std::int64_t positions) {
  const std::vector<double> inv = rope_inv_freq(f);
  RopeTable t;
  t.positions = positions;
  t.half = f.rot / 2;
  t.cos = make_float("rope::cos", positions * t.half);
  t.sin = make_float("rope::sin", positions * t.half);
  auto hc = Kokkos::create_mirror_view(t.cos);
  auto hs = Kokkos::create_mirror_view(t.sin);
  for (std::int64_t p = 0; p < positions; ++p)
    for (std::int64_t c = 0; c < t.half; ++c) {
      const double a = static_cast<double>(p) * inv[static_cast<size_t>(c)];
      hc(p * t.half + c) = static_cast<float>(std::cos(a));
      hs(p * t.half + c) = static_cast<float>(std::sin(a));
    }
  Kokkos::deep_copy(t.cos, hc);
  Kokkos::deep_copy(t.sin, hs);
  return t;
}

namespace detail {

// dir +1: the forward turn; -1: its transpose (the inverse), for gradients.
template <class F, class V>
void rope_apply(const V& x, const RopeTable& t, const RopeLayout& l, const IntView& positions, float dir) {
  const FloatView cs = t.cos, sn = t.sin;
  const IntView pos = positions;
  const bool explicit_pos = positions.extent(0) > 0;
  const std::int64_t half = t.half, T = l.T, width = l.width, hs = l.hs, q0 = l.q0, nq = l.nq, k0 = l.k0, nk = l.nk;
  for_each_index(
      "ops::rope", l.rows, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t p = explicit_pos ? static_cast<std::int64_t>(pos(r)) : r % T;
        for (std::int64_t h = 0; h < nq + nk; ++h) {
          const std::int64_t base = r * width + (h < nq ? q0 + h * hs : k0 + (h - nq) * hs);
          for (std::int64_t c = 0; c < half; ++c) {
            const float co = cs(p * half + c), si = dir * sn(p * half + c);
            const float a = F::load(x(base + c)), b = F::load(x(base + c + half));
            x(base + c) = F::store(a * co - b * si);
            x(base + c + half) = F::store(b * co + a * si);
          }
        }
      });
}

}  // namespace detail

void rope_forward(const Act& x, const RopeTable& t, const RopeLayout& l, const IntView& positions) {
  switch (x.dt) {
    case DType::F32: detail::rope_apply<F32Fmt>(x.f, t, l, positions, 1.f); break;
    case DType::BF16: detail::rope_apply<Bf16Fmt>(x.h, t, l, positions, 1.f); break;
    case DType::F16: detail::rope_apply<Fp16Fmt>(x.h, t, l, positions, 1.f); break;
  }
}

void rope_backward(const Act& dx, const RopeTable& t, const RopeLayout& l, const IntView& positions) {
  switch (dx.dt) {
    case DType::F32: detail::rope_apply<F32Fmt>(dx.f, t, l, positions, -1.f); break;
    case DType::BF16: detail::rope_apply<Bf16Fmt>(dx.h, t, l, positions, -1.f); break;
    case DType::F16: detail::rope_apply<Fp16Fmt>(dx.h, t, l, positions, -1.f); break;
  }
}

}  // namespace trident
