// bf16 and fp16 as raw 16-bit words (docs/DESIGN.md: Kokkos' own half types are 4 bytes on
// host builds), with conversions usable in kernels on every backend. float -> 16 bits rounds to
// nearest, ties to even, as the GPU's conversion instructions do: NaN stays NaN (quiet),
// values beyond the largest finite half round to infinity, fp16 subnormals are produced and
// read exactly. 16 bits -> float is exact.
#pragma once
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/types.hpp"

namespace trident {

enum class DType { F32, BF16, F16 };

inline const char* dtype_name(DType d) { return d == DType::BF16 ? "bf16" : d == DType::F16 ? "fp16" : "fp32"; }
inline std::int64_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bf16: the upper 16 bits of a float ----
KOKKOS_INLINE_FUNCTION std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // round to nearest even on the dropped 16 bits (overflow carries into the exponent: inf)
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}
KOKKOS_INLINE_FUNCTION float bf16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

// ---- fp16: IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits, bias 15) ----
KOKKOS_INLINE_FUNCTION std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: rounds to inf
  const int e = static_cast<int>(a >> 23) - 127;                            // unbiased exponent
  if (e >= -14) {                                                           // normal half
    const std::uint32_t m = a & 0x7fffffu;
    std::uint32_t h = (static_cast<std::uint32_t>(e + 15) << 10) | (m >> 13);
    const std::uint32_t rest = m & 0x1fffu;                    // 13 dropped bits
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<std::uint16_t>(sign | h);
  }
  if (e < -25) return sign;  // below half the smallest subnormal (2^-25): zero
  // subnormal half: value = mant * 2^-24, mant = a's significand (with the implicit 1) >> shift
  const std::uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const int shift = -e - 1;  // 24-bit significand scaled to units of 2^-24: shift = 13 + (-14 - e)
  const std::uint32_t mant = sig >> shift;
  const std::uint32_t rest = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  std::uint32_t h = mant;
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
KOKKOS_INLINE_FUNCTION float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in float
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

// Compile-time formats for kernels templated on the 16-bit type (dispatched once per call on
// the run-time DType, never per element).
struct F32Fmt {  // the identity format: kernels templated on a format also serve fp32 views
  static constexpr DType dtype = DType::F32;
  KOKKOS_INLINE_FUNCTION static float load(float x) { return x; }
  KOKKOS_INLINE_FUNCTION static float store(float f) { return f; }
};
struct Bf16Fmt {
  static constexpr DType dtype = DType::BF16;
  KOKKOS_INLINE_FUNCTION static float load(std::uint16_t h) { return bf16_to_float(h); }
  KOKKOS_INLINE_FUNCTION static std::uint16_t store(float f) { return float_to_bf16(f); }
};
struct Fp16Fmt {
  static constexpr DType dtype = DType::F16;
  KOKKOS_INLINE_FUNCTION static float load(std::uint16_t h) { return fp16_to_float(h); }
  KOKKOS_INLINE_FUNCTION static std::uint16_t store(float f) { return float_to_fp16(f); }
};

// Rounds a float to the nearest value of the 16-bit type (the value a 16-bit store keeps).
KOKKOS_INLINE_FUNCTION float round_to(DType d, float f) {
  return d == DType::BF16 ? bf16_to_float(float_to_bf16(f)) : d == DType::F16 ? fp16_to_float(float_to_fp16(f)) : f;
}

// 16-bit words in device memory.
using HalfView = View1<std::uint16_t>;
inline HalfView make_half(const char* label, std::int64_t n) {
  return HalfView(std::string(label), static_cast<size_t>(n));
}

// A tensor whose storage type is chosen at run time: fp32 in `f`, or bf16 / fp16 words in `h`
// (exactly one of them is allocated, as `dt` says). The ops that accept either take an Act and
// choose their kernel once inside; an fp32 View converts to one implicitly.
struct Act {
  DType dt = DType::F32;
  FloatView f;  // (size()) fp32 values when dt == F32, else empty
  HalfView h;   // (size()) bf16 / fp16 words when dt != F32, else empty
  Act() = default;
  Act(const FloatView& values) : f(values) {}  // NOLINT: implicit, fp32
  Act(DType type, const HalfView& words) : dt(type), h(words) {}
  // the element address (fp32 or 16-bit), for GEMM operands
  const void* data() const { return is_half() ? static_cast<const void*>(h.data()) : f.data(); }
  bool is_half() const { return dt != DType::F32; }
  std::int64_t size() const { return static_cast<std::int64_t>(is_half() ? h.extent(0) : f.extent(0)); }
  std::int64_t bytes() const { return size() * dtype_bytes(dt); }
};
inline Act make_act(DType dt, const char* label, std::int64_t n) {
  Act a;
  a.dt = dt;
  if (dt == DType::F32)
    a.f = make_float(label, n);
  else
    a.h = make_half(label, n);
  return a;
}
inline Act act(const FloatView& f) { return Act(f); }

}  // namespace trident
