// Dropout's statistics (issue 18): over 10^7 draws the kept fraction is 1 - p within 4 sigma, a
// kept element is scaled by exactly 1/(1 - p) (in float, as the kernels compute it) and a dropped
// one is 0, the mask is element i kept iff dropout_uniform(key, i) >= p, backward applies the same
// mask as forward, and masks are independent across neighbouring positions and across the keys
// of other micro-batches, layers and sites: the joint keep fraction equals the product of the two
// masks' own fractions within 4 sigma.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/dropout.hpp"
#include "test_helpers.hpp"

using namespace trident;
using trident::test::to_device;
using trident::test::to_host;

namespace {

constexpr std::int64_t kN = 10'000'000;

// The forward mask of key `key` on kN ones: 1 kept, 0 dropped; checks the values on the way.
std::vector<std::uint8_t> mask_of(std::uint64_t key, float p) {
  FloatView x = make_float("ones", kN);
  Kokkos::deep_copy(x, 1.f);
  dropout_forward(x, x, kN, DropoutSpec{p, key});
  const std::vector<float> y = to_host(x);
  const float scale = 1.f / (1.f - p);
  std::vector<std::uint8_t> m(kN);
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < kN; ++i) {
    m[i] = y[i] != 0.f;
    if (y[i] != 0.f && y[i] != scale) ++bad;
  }
  EXPECT_EQ(bad, 0) << "kept elements must be exactly 1/(1-p) = " << scale;
  return m;
}

// |observed - expected| of a fraction of n Bernoulli(q) draws, in standard deviations.
double sigmas(double observed_fraction, double q, double n) {
  return std::abs(observed_fraction - q) / std::sqrt(q * (1 - q) / n);
}

}  // namespace

TEST(DropoutStatistics, KeptFractionScaleAndMaskConvention) {
  for (const float p : {0.1f, 0.5f}) {
    SCOPED_TRACE(p);
    const std::uint64_t key = dropout_key(1234, 7, 3, 1);
    const auto m = mask_of(key, p);
    std::int64_t kept = 0, convention = 0;
    for (std::int64_t i = 0; i < kN; ++i) {
      kept += m[i];
      convention += m[i] != (dropout_uniform(key, static_cast<std::uint64_t>(i)) >= p);
    }
    const double frac = static_cast<double>(kept) / kN;
    EXPECT_LT(sigmas(frac, 1.0 - p, kN), 4.0) << "kept fraction " << frac;
    EXPECT_EQ(convention, 0) << "element i is kept iff dropout_uniform(key, i) >= p";
    std::printf("p = %.1f: kept %.6f of 1e7 (expected %.6f, %.2f sigma)\n", p, frac, 1.0 - p, sigmas(frac, 1.0 - p, kN));
  }
}

TEST(DropoutStatistics, BackwardAppliesTheForwardMask) {
  const float p = 0.3f;
  const std::uint64_t key = dropout_key(99, 1, 0, 2);
  const std::int64_t n = 1 << 20;
  const std::vector<float> g = trident::test::random_vector(static_cast<std::size_t>(n), 5);
  FloatView dy = to_device(g), dx = make_float("dx", n), y = to_device(g);
  dropout_backward(dx, dy, n, DropoutSpec{p, key});
  dropout_forward(y, y, n, DropoutSpec{p, key});
  EXPECT_EQ(to_host(dx), to_host(y));
}

TEST(DropoutStatistics, MasksAreIndependentAcrossPositionsAndKeys) {
  const float p = 0.5f;
  const auto a = mask_of(dropout_key(1234, 0, 0, 0), p);
  auto fraction = [](const std::vector<std::uint8_t>& m) {
    std::int64_t k = 0;
    for (auto x : m) k += x;
    return static_cast<double>(k) / static_cast<double>(m.size());
  };
  const double pa = fraction(a);
  // neighbouring positions of one call
  std::int64_t both = 0;
  for (std::int64_t i = 0; i + 1 < kN; ++i) both += a[i] & a[i + 1];
  const double s0 = sigmas(static_cast<double>(both) / (kN - 1), pa * pa, kN - 1);
  EXPECT_LT(s0, 4.0) << "positions i, i+1";
  std::printf("positions i, i+1: joint keep %.6f (independent: %.6f, %.2f sigma)\n",
              static_cast<double>(both) / (kN - 1), pa * pa, s0);
  // the same positions under the key of the next micro-batch, another layer, another site, another stream
  const std::uint64_t others[] = {dropout_key(1234, 1, 0, 0), dropout_key(1234, 0, 1, 0), dropout_key(1234, 0, 0, 1),
                                  dropout_key(1235, 0, 0, 0)};
  for (const std::uint64_t k : others) {
    const auto b = mask_of(k, p);
    const double q = pa * fraction(b);
    std::int64_t joint = 0, same = 0;
    for (std::int64_t i = 0; i < kN; ++i) {
      joint += a[i] & b[i];
      same += a[i] == b[i];
    }
    const double s = sigmas(static_cast<double>(joint) / kN, q, kN);
    EXPECT_LT(s, 4.0) << "key " << k << ": joint keep fraction " << static_cast<double>(joint) / kN;
    EXPECT_LT(same, kN) << "identical masks";
    std::printf("key %016llx vs the first: joint keep %.6f (independent: %.6f, %.2f sigma)\n",
                static_cast<unsigned long long>(k), static_cast<double>(joint) / kN, q, s);
  }
}
