// The ops of the Llama-family layer variants (RMSNorm, SwiGLU, rotary positions): forward against
// their published definitions evaluated in double, backward against central finite differences,
// and 16-bit storage as the fp32 arithmetic of the rounded inputs, rounded once (bitwise).
#include <cmath>

#include "common/half.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/rope.hpp"
#include "ops/swiglu.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

constexpr double kFwdRtol = 1e-5, kFwdAtol = 1e-5;
constexpr double kGradRtol = 2e-3, kGradAtol = 2e-3;

namespace {
std::vector<size_t> every_index(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}
}  // namespace

TEST(RMSNorm, ForwardMatchesDefinitionAndBackwardMatchesFiniteDifferences) {
  const std::int64_t N = 3, C = 8;
  const float eps = 1e-6f;
  auto x = random_vector(N * C, 20, 2.f), w = random_vector(C, 21), R = random_vector(N * C, 22);
  auto run = [&](std::vector<float>* dx, std::vector<float>* dw) {
    auto xv = to_device(x), wv = to_device(w);
    FloatView out = make_float("o", N * C), rstd = make_float("r", N);
    rmsnorm_forward(out, rstd, xv, wv, N, C, eps);
    if (dx) {
      FloatView gx = make_float("gx", N * C), gw = make_float("gw", C);
      rmsnorm_backward(gx, gw, to_device(R), xv, wv, rstd, N, C);
      *dx = to_host(gx);
      *dw = to_host(gw);
    }
    return to_host(out);
  };
  std::vector<double> want(N * C);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += static_cast<double>(x[n * C + c]) * x[n * C + c];
    ms /= C;
    for (int c = 0; c < C; ++c) want[n * C + c] = x[n * C + c] / std::sqrt(ms + eps) * w[c];
  }
  expect_close(as_double(run(nullptr, nullptr)), want, kFwdRtol, kFwdAtol, "rmsnorm forward");
  std::vector<float> gx, gw;
  run(&gx, &gw);
  auto loss = [&] { return dot(run(nullptr, nullptr), R); };
  expect_close(as_double(gx), numeric_gradient(x, loss, every_index(N * C)), kGradRtol, kGradAtol, "rmsnorm dx");
  expect_close(as_double(gw), numeric_gradient(w, loss, every_index(C)), kGradRtol, kGradAtol, "rmsnorm dw");
}

TEST(RMSNorm, SixteenBitStorageIsTheFp32ArithmeticOfTheRoundedWeight) {
  const std::int64_t N = 5, C = 70;  // more than one 64-channel block of the weight gradient
  for (DType dt : {DType::BF16, DType::F16}) {
    auto x = random_vector(N * C, 23), w = random_vector(C, 24), R = random_vector(N * C, 25);
    const Act w16 = to_half(dt, w);  // w now holds the rounded values
    const FloatView xv = to_device(x), rv = to_device(R);
    Act o16 = make_act(dt, "o16", N * C);
    FloatView o32 = make_float("o32", N * C), r16 = make_float("r16", N), r32 = make_float("r32", N);
    rmsnorm_forward(o16, r16, xv, w16, N, C, 1e-5f);
    rmsnorm_forward(o32, r32, xv, to_device(w), N, C, 1e-5f);
    const auto a = words(o16);
    const auto b = to_host(o32);
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(a[i], round16(dt, b[i])) << i;
    FloatView gx16 = make_float("gx16", N * C), gw16 = make_float("gw16", C);
    FloatView gx32 = make_float("gx32", N * C), gw32 = make_float("gw32", C);
    rmsnorm_backward(gx16, gw16, rv, xv, w16, r16, N, C);
    rmsnorm_backward(gx32, gw32, rv, xv, to_device(w), r32, N, C);
    const auto g16 = to_host(gx16), g32 = to_host(gx32), d16 = to_host(gw16), d32 = to_host(gw32);
    // the same arithmetic; the compiler may contract a multiply-add differently per format (1 ulp)
    expect_close(as_double(g16), as_double(g32), 1e-6, 1e-7, "rmsnorm 16-bit dx");
    expect_close(as_double(d16), as_double(d32), 1e-6, 1e-7, "rmsnorm 16-bit dw");
  }
}

TEST(SwiGLU, ForwardMatchesDefinitionAndBackwardMatchesFiniteDifferences) {
  const std::int64_t rows = 3, F = 5;
  auto y = random_vector(rows * 2 * F, 30, 2.f), bias = random_vector(2 * F, 31), R = random_vector(rows * F, 32);
  auto run = [&](std::vector<float>* dy) {
    Act pre = make_act(DType::F32, "pre", rows * 2 * F), out = make_act(DType::F32, "out", rows * F);
    bias_swiglu_forward(pre, out, to_device(y), to_device(bias), rows, F);
    if (dy) {
      FloatView d = make_float("d", rows * 2 * F);
      swiglu_backward(d, to_device(R), pre, rows, F);
      *dy = to_host(d);
      FloatView inf = make_float("inf", rows * F);
      swiglu_forward(inf, pre.f, rows, F);  // inference: the same values from the biased pre
      const auto a = to_host(inf), b = to_host(out.f);
      for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(float_bits(a[i]), float_bits(b[i])) << i;
    }
    return to_host(out.f);
  };
  std::vector<double> want(rows * F);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < F; ++c) {
      const double g = static_cast<double>(y[r * 2 * F + c]) + bias[c];
      const double u = static_cast<double>(y[r * 2 * F + F + c]) + bias[F + c];
      want[r * F + c] = g / (1.0 + std::exp(-g)) * u;
    }
  expect_close(as_double(run(nullptr)), want, kFwdRtol, kFwdAtol, "swiglu forward");
  std::vector<float> dy;
  run(&dy);
  auto loss = [&] { return dot(run(nullptr), R); };
  expect_close(as_double(dy), numeric_gradient(y, loss, every_index(y.size())), kGradRtol, kGradAtol,
               "swiglu d[gate|up]");
}

TEST(SwiGLU, SixteenBitStorageIsTheFp32ArithmeticOfTheRoundedPreActivation) {
  const std::int64_t rows = 4, F = 9;
  for (DType dt : {DType::BF16, DType::F16}) {
    auto y = random_vector(rows * 2 * F, 33), R = random_vector(rows * F, 34);
    std::vector<float> zero(2 * F, 0.f);
    Act pre16 = make_act(dt, "pre16", rows * 2 * F), out16 = make_act(dt, "out16", rows * F);
    bias_swiglu_forward(pre16, out16, to_device(y), to_half(dt, zero), rows, F);
    const auto p = words(pre16), o = words(out16);
    std::vector<float> pre(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      pre[i] = widen16(dt, p[i]);
      ASSERT_EQ(p[i], round16(dt, y[i])) << i;  // the GEMM output rounded once (zero bias)
    }
    Act pre32 = make_act(DType::F32, "pre32", rows * 2 * F), out32 = make_act(DType::F32, "out32", rows * F);
    bias_swiglu_forward(pre32, out32, to_device(pre), to_device(zero), rows, F);
    const auto o32 = to_host(out32.f);
    for (size_t i = 0; i < o32.size(); ++i) ASSERT_EQ(o[i], round16(dt, o32[i])) << i;
    FloatView d16 = make_float("d16", rows * 2 * F), d32 = make_float("d32", rows * 2 * F);
    swiglu_backward(d16, to_device(R), pre16, rows, F);
    swiglu_backward(d32, to_device(R), pre32, rows, F);
    const auto a = to_host(d16), b = to_host(d32);
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(float_bits(a[i]), float_bits(b[i])) << i;
  }
}

namespace {
// Hugging Face Llama's definition in double: inv_freq_j = base^(-2j/rot); cos/sin of
// cat(freqs, freqs); q' = q cos + rotate_half(q) sin on the first rot channels of each head.
std::vector<double> rope_reference(const std::vector<float>& x, const RopeLayout& l, std::int64_t rot, double base,
                                   const std::vector<int>& pos) {
  std::vector<double> out(x.begin(), x.end());
  const std::int64_t h = rot / 2;
  for (std::int64_t r = 0; r < l.rows; ++r) {
    const double p = pos.empty() ? static_cast<double>(r % l.T) : pos[static_cast<size_t>(r)];
    for (std::int64_t head = 0; head < l.nq + l.nk; ++head) {
      const std::int64_t b = r * l.width + (head < l.nq ? l.q0 + head * l.hs : l.k0 + (head - l.nq) * l.hs);
      for (std::int64_t c = 0; c < rot; ++c) {
        const double f = std::pow(base, -2.0 * static_cast<double>(c % h) / static_cast<double>(rot));
        const double rh = c < h ? -static_cast<double>(x[b + c + h]) : static_cast<double>(x[b + c - h]);
        out[b + c] = x[b + c] * std::cos(p * f) + rh * std::sin(p * f);
      }
    }
  }
  return out;
}
}  // namespace

TEST(Rope, ForwardMatchesHuggingFaceDefinitionAndBackwardIsItsAdjoint) {
  // 2 sequences of 7 rows; 2 query and 2 key heads of 8 channels, 6 of them turned (rotary_percent
  // 0.75), then 16 value channels the turn leaves alone
  RopeLayout l;
  l.rows = 14, l.T = 7, l.width = 48, l.hs = 8, l.q0 = 0, l.nq = 2, l.k0 = 16, l.nk = 2;
  RopeFrequencies f;
  f.rot = 6;
  f.base = 500.0;
  const RopeTable t = make_rope_table(f, 16);
  auto x = random_vector(l.rows * l.width, 40), R = random_vector(l.rows * l.width, 41);
  auto run = [&](std::vector<float>* dx) {
    FloatView v = to_device(x);
    rope_forward(v, t, l);
    if (dx) {
      FloatView d = to_device(R);
      rope_backward(d, t, l);
      *dx = to_host(d);
    }
    return to_host(v);
  };
  expect_close(as_double(run(nullptr)), rope_reference(x, l, 6, 500.0, {}), kFwdRtol, kFwdAtol, "rope forward");
  std::vector<float> dx;
  run(&dx);
  auto loss = [&] { return dot(run(nullptr), R); };
  const auto idx = sample_indices(x.size(), 120, 3);
  expect_close(pick(dx, idx), numeric_gradient(x, loss, idx), kGradRtol, kGradAtol, "rope backward");
  // explicit positions (generation) are the rows' positions
  std::vector<int> pos(static_cast<size_t>(l.rows));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int>((5 * i + 3) % 16);
  FloatView v = to_device(x);
  rope_forward(v, t, l, to_device(std::vector<std::int32_t>(pos.begin(), pos.end())));
  expect_close(as_double(to_host(v)), rope_reference(x, l, 6, 500.0, pos), kFwdRtol, kFwdAtol, "rope positions");
}

TEST(Rope, SixteenBitStorageIsTheFp32TurnOfTheRoundedInputs) {
  RopeLayout l;
  l.rows = 6, l.T = 3, l.width = 24, l.hs = 4, l.q0 = 0, l.nq = 2, l.k0 = 8, l.nk = 2;
  RopeFrequencies f;
  f.rot = 4;
  const RopeTable t = make_rope_table(f, 3);
  for (DType dt : {DType::BF16, DType::F16}) {
    auto x = random_vector(l.rows * l.width, 42);
    Act x16 = to_half(dt, x);
    FloatView x32 = to_device(x);
    rope_forward(x16, t, l);
    rope_forward(x32, t, l);
    const auto a = words(x16);
    const auto b = to_host(x32);
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(a[i], round16(dt, b[i])) << i;
    // the backward turn of a 16-bit gradient (cuDNN's dq|dk|dv on the device path): the fp32 turn
    // of its widened words, rounded once
    std::vector<float> wide(a.size());
    for (size_t i = 0; i < a.size(); ++i) wide[i] = widen16(dt, a[i]);
    rope_backward(x16, t, l);
    FloatView back = to_device(wide);
    rope_backward(back, t, l);
    const auto c = words(x16);
    const auto d = to_host(back);
    for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(c[i], round16(dt, d[i])) << "backward " << i;
  }
}

TEST(Rope, Llama31ScalingFollowsItsPublishedFormula) {
  // Llama 3.1 8B: head 128, base 500000, factor 8, low 1, high 4, original context 8192
  RopeFrequencies f;
  f.rot = 128;
  f.base = 500000.0;
  f.scaling = true;
  const auto inv = rope_inv_freq(f);
  const double pi = std::acos(-1.0);
  for (int j = 0; j < 64; ++j) {
    const double v = std::pow(500000.0, -2.0 * j / 128.0), wl = 2 * pi / v;
    double want = v;  // wavelengths under 8192 / 4 = 2048 positions: unchanged
    if (wl > 8192.0)
      want = v / 8.0;         // over 8192 / 1: divided by the factor
    else if (wl >= 2048.0) {  // between: the blend of the two
      const double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
      want = (1 - s) * v / 8.0 + s * v;
    }
    EXPECT_NEAR(inv[static_cast<size_t>(j)], want, 1e-15 * std::max(1.0, want)) << j;
  }
  EXPECT_DOUBLE_EQ(inv[0], 1.0);                                    // the fastest turn is kept
  EXPECT_DOUBLE_EQ(inv[63], std::pow(500000.0, -126.0 / 128) / 8);  // the slowest is divided by 8
}
