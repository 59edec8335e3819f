// Fused bias + GELU and bias + dropout + residual add against the unfused sequences they
// replace, in fp32 and with bf16 storage: bias + GELU bitwise; bias + dropout + add within one
// rounding of the result (it fuses the dropout scaling and the add into an FMA), and bitwise equal
// to its formula as docs/DESIGN.md states it.
#include <cmath>
#include <cstring>

#include "common/device_math.hpp"
#include "common/half.hpp"
#include "ops/dropout.hpp"
#include "ops/elementwise.hpp"
#include "ops/fused.hpp"
#include "ops/gelu.hpp"
#include "ops/layernorm.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/mixed_precision.hpp"
#include "ops/swiglu.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {
constexpr std::int64_t kRows = 37, kCols = 29, kN = kRows * kCols;

template <class V>
std::vector<std::uint32_t> bits(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), v);
  std::vector<std::uint32_t> out(h.extent(0));
  for (size_t i = 0; i < out.size(); ++i) {
    std::uint32_t u = 0;
    std::memcpy(&u, &h(i), sizeof(h(i)));
    out[i] = u;
  }
  return out;
}

// |a - b| <= one rounding of the larger of the two addends (residual and scaled branch, the
// latter at most 2 |branch + bias| for p <= 0.5) per element
std::vector<float> g_res, g_branch, g_bias;
void expect_one_rounding(const FloatView& a, const FloatView& b) {
  const auto x = to_host(a), y = to_host(b);
  for (size_t i = 0; i < x.size(); ++i) {
    const double mag = std::fabs(g_res[i]) + 2.0 * std::fabs(g_branch[i] + g_bias[i % kCols]);
    ASSERT_LE(std::fabs(x[i] - y[i]), 1.2e-7 * mag + 1e-30) << i << ": " << x[i] << " vs " << y[i];
  }
}

Act half_of(const std::vector<float>& v, DType dt = DType::BF16) {
  Act a;
  a.dt = dt;
  a.h = make_half("h", static_cast<std::int64_t>(v.size()));
  pack_half(dt, a.h, to_device(v), static_cast<std::int64_t>(v.size()));
  return a;
}
}  // namespace

TEST(Fused, BiasGeluEqualsBiasThenGeluFp32) {
  const auto y = random_vector(kN, 1), b = random_vector(kCols, 2);
  FloatView ref = to_device(y), ref_out = make_float("ref_out", kN);
  add_bias(ref, to_device(b), kRows, kCols);
  gelu_forward(ref_out, ref, kN);
  Act pre = act(to_device(y)), out = make_act(DType::F32, "out", kN);
  bias_gelu_forward(pre, out, pre.f, act(to_device(b)), kRows, kCols);
  EXPECT_EQ(bits(pre.f), bits(ref));
  EXPECT_EQ(bits(out.f), bits(ref_out));
}

TEST(Fused, BiasGeluEqualsBiasThenGeluBf16) {
  const auto y = random_vector(kN, 3), b = random_vector(kCols, 4);
  const Act bias = half_of(b);
  HalfView ref_pre = make_half("ref_pre", kN), ref_out = make_half("ref_out", kN);
  add_bias_pack_half(DType::BF16, ref_pre, to_device(y), bias.h, kRows, kCols);
  gelu_forward(Act(DType::BF16, ref_out), Act(DType::BF16, ref_pre), kN);
  Act pre = make_act(DType::BF16, "pre", kN), out = make_act(DType::BF16, "out", kN);
  bias_gelu_forward(pre, out, to_device(y), bias, kRows, kCols);
  EXPECT_EQ(bits(pre.h), bits(ref_pre));
  EXPECT_EQ(bits(out.h), bits(ref_out));
}

// The bias gradient and the 16-bit copy of the output gradient in one pass: the bits of
// bias_backward then pack_half (device kernels: the same column sums, the copy written on the way),
// into a bias gradient that already holds a sum (accumulation), for bf16 and fp16 copies; over
// more rows than one part of the device layout's column sums.
TEST(Fused, BiasBackwardPackHalfEqualsBiasBackwardThenPack) {
  const std::int64_t rows = 300, cols = 29;
  const auto dy = random_vector(rows * cols, 5), db0 = random_vector(cols, 6);
  for (DType dt : {DType::BF16, DType::F16}) {
    FloatView ref_db = to_device(db0), db = to_device(db0);
    HalfView ref16 = make_half("ref16", rows * cols), dy16 = make_half("dy16", rows * cols);
    const FloatView d = to_device(dy);
    bias_backward(ref_db, d, rows, cols);
    pack_half(dt, ref16, d, rows * cols);
    bias_backward_pack_half(dt, db, dy16, d, rows, cols);
    EXPECT_EQ(bits(db), bits(ref_db)) << dtype_name(dt);
    EXPECT_EQ(bits(dy16), bits(ref16)) << dtype_name(dt);
    EXPECT_NE(bits(db), bits(to_device(db0))) << "the bias gradient did not move";
    // the same gradient arriving in 16 bits (the cudnn attention's dq|dk|dv into qkv's bias): the
    // sums of the widened words, bitwise those of the fp32 path on the widened values
    FloatView db16 = to_device(db0), ref_db16 = to_device(db0), wide = make_float("wide", rows * cols);
    unpack_half(dt, wide, ref16, rows * cols);
    bias_backward(ref_db16, wide, rows, cols);
    bias_backward_half(dt, db16, ref16, rows, cols);
    EXPECT_EQ(bits(db16), bits(ref_db16)) << dtype_name(dt);
  }
}

// The activations' backward written as fc1's 16-bit output gradient (the device path's MLP): the
// bits of the backward, the bias gradient and pack_half in turn; GELU with and without the bias
// gradient, SwiGLU ([gate | up] columns), bf16 and fp16.
TEST(Fused, ActivationBackwardPackHalfEqualsBackwardThenPack) {
  const std::int64_t rows = 300, F = 29;
  const auto dout = random_vector(rows * F, 7), db0 = random_vector(2 * F, 8);
  for (DType dt : {DType::BF16, DType::F16}) {
    const FloatView d = to_device(dout);
    // GELU
    const Act pre = half_of(random_vector(rows * F, 9, 3.f), dt);
    for (bool bias : {true, false}) {
      FloatView ref = make_float("ref", rows * F), ref_db = to_device(db0), db = to_device(db0);
      HalfView ref16 = make_half("ref16", rows * F), got16 = make_half("got16", rows * F);
      gelu_backward(ref, d, pre, rows * F);
      if (bias) bias_backward(ref_db, ref, rows, F);
      pack_half(dt, ref16, ref, rows * F);
      gelu_backward_pack_half(dt, got16, bias ? slice(db, 0, F) : FloatView(), d, pre.h, rows, F);
      EXPECT_EQ(bits(got16), bits(ref16)) << dtype_name(dt) << " gelu, bias " << bias;
      EXPECT_EQ(bits(db), bits(ref_db)) << dtype_name(dt) << " gelu bias gradient, bias " << bias;
    }
    // SwiGLU: pre (rows, 2F) = [gate | up]
    const Act pre2 = half_of(random_vector(rows * 2 * F, 10, 3.f), dt);
    FloatView ref = make_float("ref", rows * 2 * F);
    HalfView ref16 = make_half("ref16", rows * 2 * F), got16 = make_half("got16", rows * 2 * F);
    swiglu_backward(ref, d, pre2, rows, F);
    pack_half(dt, ref16, ref, rows * 2 * F);
    swiglu_backward_pack_half(dt, got16, d, pre2.h, rows, F);
    EXPECT_EQ(bits(got16), bits(ref16)) << dtype_name(dt) << " swiglu";
  }
}

// The residual branch's dropout backward written as the row-parallel linear's 16-bit output
// gradient: the bits of dropout_backward, bias_backward and pack_half in turn, with the dropout on
// and off, with and without the bias gradient, and under context parallelism's mapped counters.
TEST(Fused, DropoutBackwardPackHalfEqualsBackwardThenPack) {
  const std::int64_t rows = 300, cols = 29;
  const auto dout = random_vector(rows * cols, 11), db0 = random_vector(cols, 12);
  DropoutSpec mapped{0.25f, 77};
  mapped.cp = 2;
  mapped.cp_rank = 1;
  mapped.Tl = 30;
  for (DType dt : {DType::BF16, DType::F16})
    for (const DropoutSpec& d : {DropoutSpec{0.1f, 1234}, DropoutSpec{}, mapped})
      for (bool bias : {true, false}) {
        const FloatView g = to_device(dout);
        FloatView ref = make_float("ref", rows * cols), ref_db = to_device(db0), db = to_device(db0);
        HalfView ref16 = make_half("ref16", rows * cols), got16 = make_half("got16", rows * cols);
        dropout_backward(ref, g, rows * cols, d, cols);
        if (bias) bias_backward(ref_db, ref, rows, cols);
        pack_half(dt, ref16, ref, rows * cols);
        dropout_backward_pack_half(dt, got16, bias ? db : FloatView(), g, rows, cols, d);
        EXPECT_EQ(bits(got16), bits(ref16)) << dtype_name(dt) << " p " << d.p << " cp " << d.cp << " bias " << bias;
        EXPECT_EQ(bits(db), bits(ref_db)) << dtype_name(dt) << " p " << d.p << " cp " << d.cp << " bias " << bias;
      }
}

TEST(Fused, BiasDropoutAddEqualsTheUnfusedSequence) {
  const auto branch = random_vector(kN, 5), res = random_vector(kN, 6), b = random_vector(kCols, 7);
  g_res = res;
  g_branch = branch;
  g_bias = b;
  for (float p : {0.f, 0.25f}) {
    DropoutSpec d;
    d.p = p;
    d.key = 4242;
    // fp32 bias
    SCOPED_TRACE(p);
    FloatView br = to_device(branch), ref = make_float("ref", kN);
    add_bias(br, to_device(b), kRows, kCols);
    dropout_forward(br, br, kN, d);
    add(ref, to_device(res), br, kN);
    FloatView out = make_float("out", kN);
    bias_dropout_add(out, to_device(res), to_device(branch), act(to_device(b)), kRows, kCols, d);
    expect_one_rounding(out, ref);
    // bf16 bias
    const Act bias = half_of(b);
    FloatView br16 = to_device(branch), ref16 = make_float("ref16", kN);
    add_bias(br16, bias, kRows, kCols);
    dropout_forward(br16, br16, kN, d);
    add(ref16, to_device(res), br16, kN);
    bias_dropout_add(out, to_device(res), to_device(branch), bias, kRows, kCols, d);
    expect_one_rounding(out, ref16);
  }
}

// The documented rounding (docs/DESIGN.md "Dropout"): v = branch + bias rounded; a kept element is
// residual + v / (1 - p) as one fused multiply-add where this build's kernels fuse (dfma_fuses),
// a dropped one residual + 0; without dropout, residual + v. The expected values round once per
// operation (volatile temporaries), over rows long enough for the host loop's vector bodies and
// remainders, with fp32 and bf16 biases.
TEST(Fused, BiasDropoutAddGivesTheBitsOfItsFormula) {
  constexpr std::int64_t rows = 5, cols = 771, n = rows * cols;
  const auto branch = random_vector(n, 11), res = random_vector(n, 12), b = random_vector(cols, 13);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const Act bias = dt == DType::F32 ? act(to_device(b)) : half_of(b, dt);
    std::vector<float> bias_value(b);
    for (auto& x : bias_value)
      x = dt == DType::BF16 ? bf16_to_float(float_to_bf16(x)) : dt == DType::F16 ? fp16_to_float(float_to_fp16(x)) : x;
    for (float p : {0.f, 0.1f, 0.5f}) {
      SCOPED_TRACE(testing::Message() << "p " << p << " bias " << static_cast<int>(dt));
      DropoutSpec d;
      d.p = p;
      d.key = 977;
      FloatView out = make_float("out", n);
      bias_dropout_add(out, to_device(res), to_device(branch), bias, rows, cols, d);
      const auto got = to_host(out);
      const float scale = 1.f / (1.f - p);
      std::int64_t dropped = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        volatile float v = branch[i] + bias_value[i % cols];
        float want;
        if (!d.active()) {
          volatile float sum = res[i] + v;
          want = sum;
        } else if (dropout_uniform(d.key, static_cast<std::uint64_t>(i)) >= p) {
          volatile float scaled = v * scale;
          volatile float sum = scaled + res[i];
          want = (dfma_fuses() && dt != DType::F16) ? std::fma(static_cast<float>(v), scale, res[i])
                                                    : static_cast<float>(sum);
        } else {
          volatile float sum = res[i] + 0.f;
          want = sum;
          ++dropped;
        }
        ASSERT_EQ(std::memcmp(&want, &got[i], sizeof(float)), 0) << "element " << i << ": " << got[i] << " vs " << want;
      }
      if (p > 0) EXPECT_GT(dropped, 0);
    }
  }
}

// A norm's forward with its residual add (ResidualAdd: one kernel on the device path) gives the
// bits of bias_dropout_add followed by the norm: the sum stored, the normalised rows and their
// statistics; LayerNorm and RMSNorm, fp32, bf16 and fp16, with and without dropout, context-parallel
// counters too.
TEST(Fused, NormWithItsResidualAddEqualsAddThenNorm) {
  const std::int64_t rows = 37, cols = 96, n = rows * cols;
  const auto branch = random_vector(n, 21), res = random_vector(n, 22), b = random_vector(cols, 23);
  const auto w = random_vector(cols, 24), beta = random_vector(cols, 25);
  DropoutSpec mapped{0.2f, 99};
  mapped.cp = 2;
  mapped.cp_rank = 0;
  mapped.Tl = 37;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const DropoutSpec& d : {DropoutSpec{}, DropoutSpec{0.1f, 4321}, mapped})
      for (bool rms : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " p " << d.p << " cp " << d.cp
                                        << (rms ? " RMSNorm" : " LayerNorm"));
        const auto param = [&](const std::vector<float>& v) {
          return dt == DType::F32 ? act(to_device(v)) : half_of(v, dt);
        };
        const Act bias = param(b), wv = param(w), bv = param(beta);
        const auto run = [&](bool fused, FloatView& x, Act& out, FloatView& mean, FloatView& rstd) {
          x = make_float("x", n);
          out = make_act(dt, "out", n);
          mean = make_float("mean", rows);
          rstd = make_float("rstd", rows);
          const FloatView r = to_device(res), br = to_device(branch);
          ResidualAdd pre;
          if (fused)
            pre = ResidualAdd{r, br, bias, d};
          else
            bias_dropout_add(x, r, br, bias, rows, cols, d);
          if (rms)
            rmsnorm_forward(out, rstd, x, wv, rows, cols, 1e-5f, pre);
          else
            layernorm_forward(out, mean, rstd, x, wv, bv, rows, cols, 1e-5f, pre);
        };
        FloatView x0, m0, r0, x1, m1, r1;
        Act o0, o1;
        run(false, x0, o0, m0, r0);
        run(true, x1, o1, m1, r1);
        EXPECT_EQ(bits(x1), bits(x0));
        EXPECT_EQ(bits(r1), bits(r0));
        EXPECT_EQ(bits(m1), bits(m0));
        if (dt == DType::F32)
          EXPECT_EQ(bits(o1.f), bits(o0.f));
        else
          EXPECT_EQ(bits(o1.h), bits(o0.h));
      }
}
