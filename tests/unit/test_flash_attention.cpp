// Fused (FlashAttention-style) attention against the unfused reference ops (GEMMs + softmax +
// dropout) and against finite differences under a padding mask; 16-bit storage against fp32.
// cuDNN's fused attention (ops/sdpa): its plan as data (the tensors cuDNN is given address
// Trident's layout), the host's stand-in against the fused kernel, and the slot's choice of entry.
#include <cmath>

#include "common/half.hpp"
#include "ops/attention.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "layers/attention_core.hpp"
#include "layers/transformer_layer.hpp"
#include "ops/flash_attention.hpp"
#include "ops/sdpa.hpp"
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

// The plan's (b, h, s, d) views address exactly the elements Trident's kernels read: query head h
// of token (b, t) at channel h hs of its qkv row, key and value group g at C + g hs and
// C + Ckv + g hs, the output at h hs of y's row, the statistics at lse((b nh + h) T + t).
TEST(Sdpa, PlanAddressesTridentsLayoutAndRefusesWhatCudnnCannotRun) {
  AttentionShape s{2, 5, 32, 4};  // hs 8
  s.ng = 2;
  const SdpaPlan p = sdpa_plan(s, DType::BF16, true, 0.1f);
  ASSERT_TRUE(p.error.empty()) << p.error;
  const std::int64_t hs = 8, W = s.C + 2 * s.kv_C();
  EXPECT_EQ(p.h_q, 4);
  EXPECT_EQ(p.h_kv, 2);
  EXPECT_FLOAT_EQ(p.scale, 1.f / std::sqrt(8.f));
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < s.T; ++t)
      for (std::int64_t c = 0; c < hs; ++c) {
        for (std::int64_t h = 0; h < s.nh; ++h) {
          ASSERT_EQ(p.q.at(b, h, t, c), (b * s.T + t) * W + h * hs + c);
          ASSERT_EQ(p.o.at(b, h, t, c), (b * s.T + t) * s.C + h * hs + c);
          ASSERT_EQ(p.stats.at(b, h, t, 0), (b * s.nh + h) * s.T + t);
        }
        for (std::int64_t g = 0; g < s.groups(); ++g) {
          ASSERT_EQ(p.k.at(b, g, t, c), (b * s.T + t) * W + s.C + g * hs + c);
          ASSERT_EQ(p.v.at(b, g, t, c), (b * s.T + t) * W + s.C + s.kv_C() + g * hs + c);
        }
      }
  // the graph cache tells apart what shapes a graph, by its fields as by its text
  AttentionShape longer = s, wider{2, 5, 64, 4}, grouped = s;
  longer.T = 6;
  grouped.ng = 4;
  for (const SdpaPlan& o : {sdpa_plan(s, DType::BF16, false, 0.1f), sdpa_plan(s, DType::BF16, true, 0.f),
                            sdpa_plan(s, DType::F16, true, 0.1f), sdpa_plan(s, DType::BF16, true, 0.1f, true),
                            sdpa_plan(longer, DType::BF16, true, 0.1f), sdpa_plan(wider, DType::BF16, true, 0.1f),
                            sdpa_plan(grouped, DType::BF16, true, 0.1f)}) {
    EXPECT_NE(p.key(), o.key());
    EXPECT_FALSE(p.same_graph(o)) << o.key();
  }
  EXPECT_TRUE(p.same_graph(sdpa_plan(s, DType::BF16, true, 0.1f)));
  SdpaPlan moved = p;
  moved.o.offset = 1;
  EXPECT_FALSE(p.same_graph(moved));
  // refused, each with its reason
  EXPECT_NE(sdpa_plan(s, DType::F32, true, 0.f).error.find("fp32"), std::string::npos);
  AttentionShape big{1, 4, 2 * 160, 2}, odd{1, 4, 2 * 12, 2}, cross{1, 4, 32, 4, 6};
  EXPECT_NE(sdpa_plan(big, DType::BF16, true, 0.f).error.find("head size 160"), std::string::npos);
  EXPECT_NE(sdpa_plan(odd, DType::BF16, true, 0.f).error.find("head size 12"), std::string::npos);
  EXPECT_NE(sdpa_plan(cross, DType::BF16, false, 0.f).error.find("cross-attention"), std::string::npos);
  // the masks: causal and full are cuDNN's, and key padding given as lengths too; per-key padding
  // alone and document starts are not
  AttentionMask m;
  EXPECT_EQ(sdpa_mask_error(m), "");
  m.causal = false;
  EXPECT_EQ(sdpa_mask_error(m), "");
  m.key_valid = to_device(std::vector<std::int32_t>(10, 1));
  EXPECT_NE(sdpa_mask_error(m).find("key-padding"), std::string::npos);
  m.key_len = to_device(std::vector<std::int32_t>{5, 5});
  EXPECT_EQ(sdpa_mask_error(m), "");
  AttentionMask docs;
  docs.doc_start = to_device(std::vector<std::int32_t>(10, 0));
  EXPECT_NE(sdpa_mask_error(docs).find("document"), std::string::npos);
}

// The stand-in computes what the plan says cuDNN computes: the fused kernel's function on the same
// 16-bit inputs (grouped-query heads, causal or not, with and without dropout: its masks are the
// fused kernel's; a key-padding mask as lengths, {13, 7} keys of 13, against the fused kernel's
// per-key mask), with dq, dk, dv rounded to 16 bits as cuDNN writes them (and zero at padded keys,
// over what the buffer held).
TEST(Sdpa, StandInMatchesTheFusedKernel) {
  for (const DType dt : {DType::BF16, DType::F16})
    for (const bool causal : {true, false})
      for (const float p : {0.f, 0.2f})
        for (const bool padded : {false, true}) {
          AttentionShape s{2, 13, 64, 4};  // hs 16
          s.ng = 2;
          const std::int64_t BT = s.B * s.T, W = s.C + 2 * s.kv_C();
          DropoutSpec d;
          d.p = p;
          d.key = 424242;
          AttentionMask mask;
          mask.causal = causal;
          SdpaLengths len;
          if (padded) {
            const std::vector<std::int32_t> keys = {13, 7};
            std::vector<std::int32_t> valid(static_cast<size_t>(BT), 0);
            for (std::int64_t b = 0; b < s.B; ++b)
              for (std::int64_t t = 0; t < keys[b]; ++t) valid[b * s.T + t] = 1;
            mask.key_valid = to_device(valid);
            mask.key_len = len.kv = to_device(keys);
            len.q = to_device(std::vector<std::int32_t>(2, static_cast<std::int32_t>(s.T)));
          }
          auto qkv_h = random_vector(BT * W, 71);
          auto dy_h = random_vector(BT * s.C, 72);
          const Act qkv = to_half(dt, qkv_h), dy16 = to_half(dt, dy_h);
          Act y = make_act(dt, "y", BT * s.C), y_ref = make_act(dt, "y_ref", BT * s.C);
          FloatView lse = make_float("lse", s.B * s.nh * s.T), lse_ref = make_float("lse_ref", s.B * s.nh * s.T);
          const SdpaPlan plan = sdpa_plan(s, dt, causal, p, padded);
          ASSERT_TRUE(plan.error.empty()) << plan.error;
          ASSERT_EQ(sdpa_mask_error(mask), "");
          sdpa_forward(plan, qkv, y, lse, d, len);
          flash_attention_forward(y_ref, lse_ref, qkv, s, d, mask);
          const auto widen = [&](const std::vector<std::uint16_t>& w) {
            std::vector<double> o(w.size());
            for (size_t i = 0; i < w.size(); ++i) o[i] = widen16(dt, w[i]);
            return o;
          };
          const std::string what = std::string(dtype_name(dt)) + (causal ? " causal" : " full") +
                                   " p=" + std::to_string(p) + (padded ? " padded" : "");
          // the same fp32 function, summed in another order, then rounded once to 16 bits
          const double ulp = dt == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
          expect_close(widen(words(y)), widen(words(y_ref)), ulp, ulp / 4,
                       ("stand-in forward vs fused, " + what).c_str());
          expect_close(as_double(to_host(lse)), as_double(to_host(lse_ref)), 1e-5, 1e-5, ("lse, " + what).c_str());
          HalfView dqkv16 = to_device(std::vector<std::uint16_t>(static_cast<size_t>(BT * W), round16(dt, 3.f)));
          sdpa_backward(plan, qkv, y, dy16.h, lse, dqkv16, d, len);
          FloatView dqkv = make_float("dqkv", BT * W), delta = make_float("delta", s.B * s.nh * s.T);
          flash_attention_backward(dqkv, to_device(dy_h), qkv, y, lse, delta, s, d, mask);
          std::vector<double> want;
          for (float g : to_host(dqkv)) want.push_back(widen16(dt, round16(dt, g)));
          expect_close(widen(words(Act(dt, dqkv16))), want, 2 * ulp, ulp / 2,
                       ("stand-in backward vs fused, " + what).c_str());
        }
}

// The slot's choice: the cudnn entry where a device build can run it and the deck allows it; the
// fused kernel otherwise, and an error where model.attention_backend = cudnn cannot be honoured.
TEST(Sdpa, TheSlotTakesCudnnWhereTheBuildAndShapeAllow) {
  TransformerShape s;
  s.hidden_size = 64;
  s.num_heads = 4;
  s.B = 2;
  s.T = 8;
  s.flash_attention = true;
  s.dt = DType::BF16;
  const bool device = kDeviceKernels && sdpa_unavailable().empty();
  EXPECT_EQ(attention_core_name(s), device ? "cudnn" : "fused");
  // the banner's line says the entry and, where cuDNN is not taken, why
  EXPECT_EQ(attention_core_summary(s).rfind(device ? "cudnn: " : "fused: ", 0), 0u) << attention_core_summary(s);
  s.attention_backend = "local";
  EXPECT_EQ(attention_core_name(s), "fused");
  s.attention_backend = "cudnn";
  if (device)
    EXPECT_EQ(attention_core_name(s), "cudnn");
  else
    EXPECT_THROW(attention_core_name(s), trident::Error);
  s.dt = DType::F32;  // cuDNN's fused attention is 16-bit
  EXPECT_THROW(attention_core_name(s), trident::Error);
  s.attention_backend = "auto";
  EXPECT_EQ(attention_core_name(s), "fused");
  const std::string why = !kDeviceKernels ? "host build" : sdpa_unavailable().empty() ? "fp32" : sdpa_unavailable();
  EXPECT_NE(attention_core_summary(s).find(why), std::string::npos) << attention_core_summary(s);
  s.flash_attention = false;
  EXPECT_EQ(attention_core_name(s), "unfused");
}
