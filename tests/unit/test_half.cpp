// bf16 / fp16 conversions (common/half.hpp): exact round trips over every 16-bit pattern,
// round-to-nearest-even against an exact reference (double arithmetic over the two candidate
// neighbours), and fp16 against the compiler's own _Float16 conversion where it has one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "common/half.hpp"

namespace trident {
namespace {

bool is_nan16(std::uint16_t h, bool bf16) {
  return bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu));
}

TEST(Half, EveryPatternRoundTripsExactly) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const std::uint16_t h = static_cast<std::uint16_t>(i);
    if (is_nan16(h, true)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(h)));
      EXPECT_TRUE(is_nan16(float_to_bf16(bf16_to_float(h)), true));
    } else {
      ASSERT_EQ(float_to_bf16(bf16_to_float(h)), h) << "bf16 pattern " << i;
    }
    if (is_nan16(h, false)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(h)));
      EXPECT_TRUE(is_nan16(float_to_fp16(fp16_to_float(h)), false));
    } else {
      ASSERT_EQ(float_to_fp16(fp16_to_float(h)), h) << "fp16 pattern " << i;
    }
  }
}

// The correctly rounded (nearest, ties to even) 16-bit value of x, found among all patterns of
// the same sign by exact distances in double (every float and every 16-bit value is exact in
// double, and so are their differences).
template <class ToFloat>
std::uint16_t reference(float x, ToFloat to_float, std::uint16_t inf_bits, double overflow_at) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= overflow_at) return static_cast<std::uint16_t>(sign | inf_bits);
  // binary search for the largest finite magnitude pattern p with value(p) <= ax
  std::uint32_t lo = 0, hi = inf_bits;  // value(lo) <= ax < value(hi)
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (static_cast<double>(to_float(static_cast<std::uint16_t>(mid))) <= ax) lo = mid; else hi = mid;
  }
  const double dlo = ax - to_float(static_cast<std::uint16_t>(lo)), dhi = to_float(static_cast<std::uint16_t>(hi)) - ax;
  std::uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1u) ? hi : lo);
  return static_cast<std::uint16_t>(sign | r);
}

TEST(Half, RoundsToNearestEvenLikeAnExactReference) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  const double bf16_overflow = std::numeric_limits<double>::infinity();  // magnitudes tested stay finite
  int checked = 0;
  for (int k = 0; k < 200000; ++k) {
    std::uint32_t u = bits(gen);
    if (k % 3 == 0) u = (u & 0xffff0000u) | 0x8000u;  // bf16 ties
    if (k % 3 == 1) u = (u & 0xffffe000u) | 0x1000u;  // fp16 ties (normal range)
    float x;
    std::memcpy(&x, &u, 4);
    if (std::isnan(x) || std::isinf(x)) continue;
    // bf16: magnitudes below the largest finite bf16 rounding boundary
    if (std::fabs(x) < 3.3895e38f) ASSERT_EQ(float_to_bf16(x), reference(x, bf16_to_float, 0x7f80u, bf16_overflow)) << x;
    // fp16: the whole range (65520 and beyond round to infinity)
    const float y = std::ldexp(std::fabs(x) / std::ldexp(1.0f, std::ilogb(x == 0 ? 1.f : x)), (k % 48) - 30) *
                    (std::signbit(x) ? -1.f : 1.f);
    ASSERT_EQ(float_to_fp16(y), reference(y, fp16_to_float, 0x7c00u, 65520.0)) << y;
    ++checked;
  }
  EXPECT_GT(checked, 100000);
  // the fp16 overflow boundary: 65504 is the largest half, 65519.99 rounds to it, 65520 to inf
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65520.f), 0x7c00u);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -24)), 0x0001u);   // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -25)), 0x0000u);   // tie to even: zero
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001u);
  EXPECT_EQ(float_to_bf16(1.f + std::ldexp(1.f, -8)), 0x3f80u);  // tie to even: 1
  EXPECT_EQ(float_to_bf16(1.f + std::ldexp(3.f, -8)), 0x3f82u);  // tie to even: up
}

#if defined(__FLT16_MAX__) && defined(__x86_64__)
TEST(Half, Fp16MatchesTheCompilersFloat16) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int k = 0; k < 1000000; ++k) {
    std::uint32_t u = bits(gen);
    u = (u & 0x807fffffu) | ((96u + (u >> 23) % 64u) << 23);  // exponents around fp16's range
    float x;
    std::memcpy(&x, &u, 4);
    const _Float16 c = static_cast<_Float16>(x);
    std::uint16_t want;
    std::memcpy(&want, &c, 2);
    ASSERT_EQ(float_to_fp16(x), want) << x;
    ASSERT_EQ(fp16_to_float(want), static_cast<float>(c));
  }
}
#endif

}  // namespace
}  // namespace trident
