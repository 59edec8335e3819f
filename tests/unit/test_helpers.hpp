// Helpers for op tests: host<->device copies of flat views, random normal fills, central finite
// differences of a scalar function at sampled indices (numeric_gradient, step 1e-2), and
// expect_close, an element-wise |a - b| <= atol + rtol |b| check that reports the first failures.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "common/rng.hpp"
#include "common/types.hpp"

namespace trident::test {

inline FloatView to_device(const std::vector<float>& v) {
  FloatView d = make_float("test", static_cast<std::int64_t>(v.size()));
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

inline IntView to_device(const std::vector<std::int32_t>& v) {
  IntView d = make_int("test", static_cast<std::int64_t>(v.size()));
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

inline std::vector<float> to_host(const FloatView& d) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

inline std::vector<float> random_vector(std::size_t n, std::uint64_t seed, float scale = 1.f) {
  NormalStream s(seed, "test");
  std::vector<float> v(n);
  for (auto& x : v) x = scale * s.next();
  return v;
}

// Central differences of a scalar function of a float vector, evaluated in double on the
// outputs of float arithmetic. With step h the truncation error is O(h^2 f''') and the
// rounding error about eps_float * |f| / h; h = 1e-2 balances the two for O(1) inputs.
inline std::vector<double> numeric_gradient(std::vector<float>& x, const std::function<double()>& f,
                                            const std::vector<std::size_t>& which, float h = 1e-2f) {
  std::vector<double> g;
  for (auto i : which) {
    const float keep = x[i];
    x[i] = keep + h;
    const double fp = f();
    x[i] = keep - h;
    const double fm = f();
    x[i] = keep;
    g.push_back((fp - fm) / (2.0 * h));
  }
  return g;
}

inline std::vector<std::size_t> sample_indices(std::size_t n, std::size_t k, std::uint64_t seed) {
  std::vector<std::size_t> out;
  CounterRng r(seed);
  for (std::size_t i = 0; i < k && i < n; ++i) out.push_back(k >= n ? i : r.below_at(i, n));
  return out;
}

// Expects |a - b| <= atol + rtol * |b| element-wise, reporting the first failures.
inline void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol,
                         const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < a.size() && failures < 5; ++i) {
    if (!(std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      ++failures;
    }
  }
}

}  // namespace trident::test
