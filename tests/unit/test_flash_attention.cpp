// Fused (FlashAttention-style) attention against the unfused reference ops (GEMMs + softmax +
// dropout) and against finite differences under a padding mask; 16-bit storage against fp32.
#include <cmath>

#include "common/half.hpp"
#include "ops/attention.hpp"
#include "ops/flash_attention.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {

// The fused and unfused paths sum the same terms in different orders (online rescaling,
// per-row dots instead of GEMMs): differences are a few fp32 ulps of O(1) values.
constexpr double kRtol = 2e-5, kAtol = 2e-6;

struct Case {
  AttentionShape s;
  float drop;
  std::vector<std::int32_t> key_valid = {};  // (B * T) padding mask, bidirectional; empty: causal
};

void compare_with_unfused(const Case& k) {
  const AttentionShape s = k.s;
  const std::int64_t BT = s.B * s.T, A = s.B * s.nh * s.T * s.T;
  DropoutSpec d;
  d.p = k.drop;
  d.key = 987654321;
  const auto qkv_h = random_vector(BT * 3 * s.C, 41), dy_h = random_vector(BT * s.C, 42);
  const FloatView qkv = to_device(qkv_h), dy = to_device(dy_h);
  AttentionMask mask;
  if (!k.key_valid.empty()) {
    mask.causal = false;
    mask.key_valid = to_device(k.key_valid);
  }
  // unfused reference
  FloatView y_ref = make_float("y_ref", BT * s.C), att = make_float("att", A), att_drop = make_float("att_drop", A);
  FloatView datt = make_float("datt", A), dqkv_ref = make_float("dqkv_ref", BT * 3 * s.C);
  attention_forward(y_ref, qkv, att, s, d, att_drop, mask);
  attention_backward(dqkv_ref, dy, qkv, att, att_drop, datt, s, d, mask);
  // fused
  Act y = make_act(DType::F32, "y", BT * s.C), q = act(qkv);
  FloatView lse = make_float("lse", s.B * s.nh * s.T), delta = make_float("delta", s.B * s.nh * s.T);
  FloatView dqkv = make_float("dqkv", BT * 3 * s.C);
  flash_attention_forward(y, lse, q, s, d, mask);
  flash_attention_backward(dqkv, dy, q, y, lse, delta, s, d, mask);
  expect_close(as_double(to_host(y.f)), as_double(to_host(y_ref)), kRtol, kAtol, "flash forward vs unfused");
  expect_close(as_double(to_host(dqkv)), as_double(to_host(dqkv_ref)), kRtol, 1e-5, "flash backward vs unfused");
}
}  // namespace

TEST(FlashAttention, CausalMatchesUnfusedOps) { compare_with_unfused({{2, 17, 16, 2}, 0.f}); }

TEST(FlashAttention, CausalWithDropoutMatchesUnfusedOps) { compare_with_unfused({{2, 13, 24, 3}, 0.3f}); }

TEST(FlashAttention, HeadSize64LikeGpt2) { compare_with_unfused({{1, 20, 128, 2}, 0.1f}); }

// BERT's encoder attention: bidirectional with a key-padding mask, in both paths (the unfused
// masked softmax against the fused kernel), with dropout; sample 2 is all padding (zero
// output and gradients in both).
TEST(FlashAttention, PaddingMaskMatchesUnfusedMaskedSoftmax) {
  std::vector<std::int32_t> valid;
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 9; ++t) valid.push_back(b == 0 ? t < 6 : b == 1 ? 1 : 0);
  compare_with_unfused({{3, 9, 16, 2}, 0.f, valid});
  compare_with_unfused({{3, 9, 16, 2}, 0.2f, valid});
}

// Bidirectional attention with padded keys (BERT/T5 encoders): forward against a double
// reference, backward against central differences.
TEST(FlashAttention, PaddingMaskForwardAndFiniteDifferences) {
  const AttentionShape s{2, 6, 8, 2};
  const std::int64_t BT = s.B * s.T;
  std::vector<std::int32_t> valid_h = {1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0};  // sample 0: 4 keys, sample 1: 3
  AttentionMask mask;
  mask.causal = false;
  mask.key_valid = to_device(valid_h);
  auto qkv_h = random_vector(BT * 3 * s.C, 51), R = random_vector(BT * s.C, 52);
  auto run = [&](std::vector<float>& in, Act& y) {
    FloatView lse = make_float("lse", s.B * s.nh * s.T);
    y = make_act(DType::F32, "y", BT * s.C);
    flash_attention_forward(y, lse, act(to_device(in)), s, {}, mask);
    return lse;
  };
  Act y;
  run(qkv_h, y);
  const std::vector<double> want = reference_attention(qkv_h, s.B, s.T, s.C, s.nh, false, valid_h);
  expect_close(as_double(to_host(y.f)), want, 1e-5, 1e-6, "flash forward with padding mask");
  // backward against finite differences of sum(R * y)
  FloatView lse = run(qkv_h, y);
  FloatView dqkv = make_float("dqkv", BT * 3 * s.C), delta = make_float("delta", s.B * s.nh * s.T);
  flash_attention_backward(dqkv, to_device(R), act(to_device(qkv_h)), y, lse, delta, s, {}, mask);
  std::vector<size_t> idx;
  for (size_t i = 0; i < qkv_h.size(); i += 3) idx.push_back(i);
  auto loss = [&] {
    Act yy;
    run(qkv_h, yy);
    return dot(to_host(yy.f), R);
  };
  const auto g = to_host(dqkv);
  std::vector<double> got;
  for (auto i : idx) got.push_back(g[i]);
  expect_close(got, numeric_gradient(qkv_h, loss, idx), 2e-3, 2e-3, "flash backward vs finite differences");
  // keys that are padding get no gradient
  for (int b = 0; b < s.B; ++b)
    for (int j = 0; j < s.T; ++j)
      if (!valid_h[b * s.T + j])
        for (int c = s.C; c < 3 * s.C; ++c) EXPECT_EQ(g[(b * s.T + j) * 3 * s.C + c], 0.f);
}

// bf16 storage: the same function of the bf16-rounded inputs, output rounded to bf16.
TEST(FlashAttention, Bf16StorageMatchesFp32OnRoundedInputs) {
  const AttentionShape s{2, 16, 32, 2};
  const std::int64_t BT = s.B * s.T;
  auto qkv_h = random_vector(BT * 3 * s.C, 61);
  auto hq = Kokkos::create_mirror_view(make_half("q16", BT * 3 * s.C));
  for (size_t i = 0; i < qkv_h.size(); ++i) qkv_h[i] = bf16_to_float(hq(i) = float_to_bf16(qkv_h[i]));
  Act q16;
  q16.dt = DType::BF16;
  q16.h = make_half("q16d", BT * 3 * s.C);
  Kokkos::deep_copy(q16.h, hq);
  Act y16 = make_act(DType::BF16, "y16", BT * s.C), y32 = make_act(DType::F32, "y32", BT * s.C);
  FloatView lse = make_float("lse", s.B * s.nh * s.T);
  flash_attention_forward(y16, lse, q16, s);
  flash_attention_forward(y32, lse, act(to_device(qkv_h)), s);
  auto a = Kokkos::create_mirror_view_and_copy(HostSpace(), y16.h);
  const auto b = to_host(y32.f);
  for (size_t i = 0; i < b.size(); ++i)
    ASSERT_EQ(a(i), float_to_bf16(b[i])) << i;  // same fp32 arithmetic, rounded once
}
