// Helpers for op tests: host<->device copies of flat views, random normal fills, central finite
// differences of a scalar function at sampled indices (numeric_gradient, step 1e-2), and
// expect_close, an element-wise |a - b| <= atol + rtol |b| check that reports the first failures,
// and reference_attention, self-attention by its definition in double.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common/half.hpp"
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

// 16-bit values (bf16 or fp16 bit patterns), as the mixed-precision GEMMs take them
inline View1<std::uint16_t> to_device(const std::vector<std::uint16_t>& v) {
  View1<std::uint16_t> d(std::string("test"), v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

inline std::vector<float> to_host(const FloatView& d) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

// bf16 / fp16 words: a float rounded to dt, and widened back
inline std::uint16_t round16(DType dt, float f) { return dt == DType::BF16 ? float_to_bf16(f) : float_to_fp16(f); }
inline float widen16(DType dt, std::uint16_t h) { return dt == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h); }
// v rounded to dt in place; returns the words as a device Act
inline Act to_half(DType dt, std::vector<float>& v) {
  std::vector<std::uint16_t> w(v.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = widen16(dt, w[i] = round16(dt, v[i]));
  return Act(dt, to_device(w));
}
// a 16-bit Act's words on the host
inline std::vector<std::uint16_t> words(const Act& a) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), a.h);
  return std::vector<std::uint16_t>(h.data(), h.data() + h.extent(0));
}

// f() with OpenMP's thread count set to t, the previous count restored after; without OpenMP, f()
template <class F>
void at_threads(int t, const F& f) {
#if defined(_OPENMP)
  const int old = omp_get_max_threads();
  omp_set_num_threads(t);
  f();
  omp_set_num_threads(old);
#else
  (void)t;
  f();
#endif
}

// sum of a[i] b[i] in double; the values widened; the values at idx widened
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}
inline std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
inline std::vector<double> pick(const std::vector<float>& v, const std::vector<size_t>& idx) {
  std::vector<double> out;
  for (auto i : idx) out.push_back(v[i]);
  return out;
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

// Self-attention by its definition, in double: per sample b, head h and query i,
// y = softmax_j(q_i . k_j / sqrt(hs)) v_j over the keys j that query i sees (j <= i when causal;
// key_valid(b T + j) != 0 when key_valid is given). qkv (B, T, 3C) packs q | k | v per token,
// head h at columns h hs .. (h + 1) hs - 1 of each third; returns y (B, T, C).
inline std::vector<double> reference_attention(const std::vector<float>& qkv, std::int64_t B, std::int64_t T,
                                               std::int64_t C, std::int64_t nh, bool causal,
                                               const std::vector<std::int32_t>& key_valid = {}) {
  const std::int64_t hs = C / nh;
  std::vector<double> y(static_cast<std::size_t>(B * T * C), 0.0);
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t e) {
    return static_cast<double>(qkv[static_cast<std::size_t>((b * T + t) * 3 * C + part * C + h * hs + e)]);
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> w(static_cast<std::size_t>(T), 0.0);  // scores, then weights (T)
        std::vector<bool> seen(static_cast<std::size_t>(T), false);
        double mx = -1e300, z = 0;
        for (std::int64_t j = 0; j < T; ++j) {
          seen[j] = (!causal || j <= i) && (key_valid.empty() || key_valid[static_cast<std::size_t>(b * T + j)]);
          if (!seen[j]) continue;
          for (std::int64_t e = 0; e < hs; ++e) w[j] += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          w[j] /= std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, w[j]);
        }
        for (std::int64_t j = 0; j < T; ++j) z += seen[j] ? (w[j] = std::exp(w[j] - mx)) : 0.0;
        for (std::int64_t e = 0; e < hs; ++e) {
          double acc = 0;
          for (std::int64_t j = 0; j < T; ++j)
            if (seen[j]) acc += w[j] / z * at(b, j, 2, h, e);
          y[static_cast<std::size_t>((b * T + i) * C + h * hs + e)] = acc;
        }
      }
  return y;
}

}  // namespace trident::test
