// Grouped-query attention (query head h reads key/value group h / (nh / ng)) in both attention
// paths: forward against self-attention by its definition on the heads expanded to multi-head
// (each group's k and v copied to its query heads), backward against central finite differences,
// dropout alike in both paths, and 16-bit storage as the fp32 arithmetic of the rounded inputs.
// Also the q/k normalisation (layers/layer_modules' QkNorm): a norm over each head, forward
// against its definition, backward against finite differences, 16 bits rounded once.
#include <cmath>

#include "common/half.hpp"
#include "layers/layer_modules.hpp"
#include "layers/param_store.hpp"
#include "ops/attention.hpp"
#include "ops/flash_attention.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {

AttentionShape grouped(std::int64_t B, std::int64_t T, std::int64_t nh, std::int64_t ng, std::int64_t hs) {
  AttentionShape s{B, T, nh * hs, nh};
  s.ng = ng;
  return s;
}
std::int64_t width(const AttentionShape& s) { return s.C + 2 * s.kv_C(); }

// (BT, C + 2 Ckv) grouped rows -> (BT, 3C) multi-head rows, each group's k and v at its heads
std::vector<float> expand(const std::vector<float>& g, const AttentionShape& s) {
  const std::int64_t BT = s.B * s.T, C = s.C, hs = s.hs(), W = width(s);
  std::vector<float> m(static_cast<size_t>(BT * 3 * C));
  for (std::int64_t r = 0; r < BT; ++r)
    for (std::int64_t h = 0; h < s.nh; ++h)
      for (std::int64_t e = 0; e < hs; ++e) {
        const std::int64_t grp = h / s.rep();
        m[r * 3 * C + h * hs + e] = g[r * W + h * hs + e];
        m[r * 3 * C + C + h * hs + e] = g[r * W + C + grp * hs + e];
        m[r * 3 * C + 2 * C + h * hs + e] = g[r * W + C + s.kv_C() + grp * hs + e];
      }
  return m;
}

// y of one path (fused or GEMMs); dqkv too when dy is given
std::vector<float> attend(bool fused, const std::vector<float>& qkv_h, const AttentionShape& s, const DropoutSpec& d,
                          const std::vector<float>* dy_h = nullptr, std::vector<float>* dqkv_h = nullptr) {
  const std::int64_t BT = s.B * s.T, A = s.B * s.nh * s.T * s.T;
  const FloatView qkv = to_device(qkv_h), y = make_float("y", BT * s.C);
  FloatView dqkv = make_float("dqkv", BT * width(s));
  if (fused) {
    FloatView lse = make_float("lse", s.B * s.nh * s.T), delta = make_float("delta", s.B * s.nh * s.T);
    flash_attention_forward(y, lse, qkv, s, d);
    if (dy_h) flash_attention_backward(dqkv, to_device(*dy_h), qkv, y, lse, delta, s, d);
  } else {
    FloatView att = make_float("att", A), att_drop = make_float("att_drop", A), datt = make_float("datt", A);
    attention_forward(y, qkv, att, s, d, att_drop);
    if (dy_h) attention_backward(dqkv, to_device(*dy_h), qkv, att, att_drop, datt, s, d);
  }
  if (dqkv_h) *dqkv_h = to_host(dqkv);
  return to_host(y);
}

}  // namespace

TEST(GroupedAttention, BothPathsMatchTheDefinitionOnExpandedHeads) {
  for (const auto& [nh, ng] : {std::pair<int, int>{4, 2}, {4, 1}, {6, 3}, {4, 4}}) {
    const AttentionShape s = grouped(2, 9, nh, ng, 8);
    const auto qkv = random_vector(s.B * s.T * width(s), 70 + nh + ng);
    const std::vector<double> want = reference_attention(expand(qkv, s), s.B, s.T, s.C, s.nh, true);
    for (const bool fused : {false, true})
      expect_close(as_double(attend(fused, qkv, s, {})), want, 1e-5, 1e-6,
                   (std::string(fused ? "fused" : "GEMM") + " forward, " + std::to_string(nh) + " heads in " +
                    std::to_string(ng) + " groups")
                       .c_str());
  }
}

TEST(GroupedAttention, BackwardMatchesFiniteDifferencesInBothPaths) {
  const AttentionShape s = grouped(2, 6, 4, 2, 4);
  auto qkv = random_vector(s.B * s.T * width(s), 81);
  const auto R = random_vector(s.B * s.T * s.C, 82);
  std::vector<size_t> idx;  // every 3rd input: queries, keys and values of both groups
  for (size_t i = 0; i < qkv.size(); i += 3) idx.push_back(i);
  for (const bool fused : {false, true}) {
    std::vector<float> dqkv;
    attend(fused, qkv, s, {}, &R, &dqkv);
    auto loss = [&] { return dot(attend(fused, qkv, s, {}), R); };
    std::vector<double> got;
    for (auto i : idx) got.push_back(dqkv[i]);
    expect_close(got, numeric_gradient(qkv, loss, idx), 2e-3, 2e-3,
                 fused ? "fused backward vs finite differences" : "GEMM backward vs finite differences");
  }
}

// The key/value gradient of a group is the sum over its query heads of the multi-head gradients
// of the expanded heads; with dropout, both paths apply the same masks.
TEST(GroupedAttention, GroupGradientsSumTheirHeadsAndDropoutAgreesAcrossPaths) {
  const AttentionShape s = grouped(2, 11, 6, 2, 8);
  const AttentionShape m{s.B, s.T, s.C, s.nh};
  const auto qkv = random_vector(s.B * s.T * width(s), 91), dy = random_vector(s.B * s.T * s.C, 92);
  DropoutSpec d;
  d.p = 0.25f;
  d.key = 13579;
  std::vector<float> dg, dm, df;
  const auto yg = attend(false, qkv, s, d, &dy, &dg);
  const auto ym = attend(false, expand(qkv, s), m, d, &dy, &dm);
  const auto yf = attend(true, qkv, s, d, &dy, &df);
  expect_close(as_double(yg), as_double(ym), 1e-6, 1e-7, "grouped vs expanded forward (dropout)");
  expect_close(as_double(yf), as_double(yg), 2e-5, 2e-6, "fused vs GEMM forward (dropout)");
  expect_close(as_double(df), as_double(dg), 2e-5, 1e-5, "fused vs GEMM backward (dropout)");
  const std::int64_t BT = s.B * s.T, C = s.C, hs = s.hs(), W = width(s);
  std::vector<double> summed(dg.size(), 0.0);
  for (std::int64_t r = 0; r < BT; ++r)
    for (std::int64_t h = 0; h < s.nh; ++h)
      for (std::int64_t e = 0; e < hs; ++e) {
        const std::int64_t grp = h / s.rep();
        summed[r * W + h * hs + e] = dm[r * 3 * C + h * hs + e];
        summed[r * W + C + grp * hs + e] += dm[r * 3 * C + C + h * hs + e];
        summed[r * W + C + s.kv_C() + grp * hs + e] += dm[r * 3 * C + 2 * C + h * hs + e];
      }
  expect_close(as_double(dg), summed, 1e-5, 1e-6, "group gradients = sums over their heads");
}

// 16-bit storage: the fused kernel is the fp32 arithmetic of the rounded inputs, rounded once;
// the GEMM path (16-bit probabilities) follows the expanded multi-head 16-bit path.
TEST(GroupedAttention, SixteenBitStorageInBothPaths) {
  const AttentionShape s = grouped(2, 12, 4, 2, 16);
  const AttentionShape m{s.B, s.T, s.C, s.nh};
  const std::int64_t BT = s.B * s.T, A = s.B * s.nh * s.T * s.T;
  for (const DType dt : {DType::BF16, DType::F16}) {
    auto qkv = random_vector(BT * width(s), 101);
    std::vector<std::uint16_t> w(qkv.size());
    for (size_t i = 0; i < qkv.size(); ++i) {
      w[i] = dt == DType::BF16 ? float_to_bf16(qkv[i]) : float_to_fp16(qkv[i]);
      qkv[i] = dt == DType::BF16 ? bf16_to_float(w[i]) : fp16_to_float(w[i]);
    }
    const Act q16(dt, to_device(w));
    Act y16 = make_act(dt, "y16", BT * s.C);
    FloatView lse = make_float("lse", s.B * s.nh * s.T);
    flash_attention_forward(y16, lse, q16, s);
    const auto y32 = attend(true, qkv, s, {});
    auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y16.h);
    for (size_t i = 0; i < y32.size(); ++i)
      ASSERT_EQ(got(i), dt == DType::BF16 ? float_to_bf16(y32[i]) : float_to_fp16(y32[i])) << i;
    // GEMM path: grouped against expanded, both 16-bit
    auto run = [&](const std::vector<float>& x, const AttentionShape& sh, std::vector<float>* dx) {
      std::vector<std::uint16_t> xw(x.size());
      for (size_t i = 0; i < x.size(); ++i) xw[i] = dt == DType::BF16 ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
      const Act xq(dt, to_device(xw));
      Act y = make_act(dt, "y", BT * sh.C), att = make_act(dt, "att", A);
      AttentionScratch sc{make_float("scores", A), make_float("att32", A), make_float("y32", BT * sh.C),
                          make_half("dy16", BT * sh.C), make_half("ds16", A)};
      attention_probs(att, Act(), xq, sh, {}, {}, sc);
      attention_context(y, att, xq, sh, sc);
      FloatView dqkv = make_float("dqkv", BT * (sh.C + 2 * sh.kv_C())), datt = make_float("datt", A);
      attention_backward(dqkv, to_device(std::vector<float>(BT * sh.C, 0.5f)), xq, att, Act(), datt, sh, {}, {}, sc);
      *dx = to_host(dqkv);
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.h);
      std::vector<float> out(h.extent(0));
      for (size_t i = 0; i < out.size(); ++i) out[i] = dt == DType::BF16 ? bf16_to_float(h(i)) : fp16_to_float(h(i));
      return out;
    };
    std::vector<float> dg, dm;
    const auto yg = run(qkv, s, &dg), ym = run(expand(qkv, s), m, &dm);
    expect_close(as_double(yg), as_double(ym), 0.0, 0.0, "16-bit GEMM path: grouped = expanded forward");
    std::vector<double> q_g, q_m;  // the query gradients agree; the key/value ones are sums
    for (std::int64_t r = 0; r < BT; ++r)
      for (std::int64_t c = 0; c < s.C; ++c) {
        q_g.push_back(dg[r * width(s) + c]);
        q_m.push_back(dm[r * 3 * s.C + c]);
      }
    expect_close(q_g, q_m, 1e-6, 1e-7, "16-bit GEMM path: query gradients");
  }
}

TEST(QkNorm, PerHeadNormMatchesDefinitionFiniteDifferencesAndRoundsOnce) {
  const std::int64_t rows = 5, nq = 4, nk = 2, hs = 8, W = (nq + 2 * nk) * hs;
  ModelArch arch;
  arch.hidden_size = 32;
  arch.num_heads = 4;
  arch.normalization = "RMSNorm";
  arch.norm_epsilon = 1e-6;
  arch.qk_layernorm = true;
  for (const DType dt : {DType::F32, DType::BF16}) {
    ParamStore store;
    store.set_dtype(dt);
    const QkNorm norm(store, "l/self_attention", arch, nq, nk, hs, W);
    store.allocate();
    store.initialize(7);
    const ParamId wq = store.find("l/self_attention/q_layernorm/weight");
    const ParamId wk = store.find("l/self_attention/k_layernorm/weight");
    ASSERT_GE(wq, 0);
    ASSERT_GE(wk, 0);
    EXPECT_TRUE(store.params()[wq].tp_partial_grad && store.params()[wk].tp_partial_grad);
    EXPECT_EQ(store.tp_partial_begin(), store.replicated_end() - 2 * hs);
    // weights not all 1: the gradient of each is its own
    auto wv = random_vector(2 * hs, 111, 0.5f);
    for (auto& v : wv) v += 1.f;
    {
      HostFloatView host = store.model_to_host();
      for (std::int64_t c = 0; c < hs; ++c) {
        host(store.params()[wq].offset + c) = wv[c];
        host(store.params()[wk].offset + c) = wv[hs + c];
      }
      store.model_from_host(host);
      for (std::int64_t c = 0; c < 2 * hs; ++c) {  // the weights as stored
        const float v = host(store.params()[c < hs ? wq : wk].offset + c % hs);
        wv[c] = dt == DType::F32 ? v : bf16_to_float(float_to_bf16(v));
      }
    }
    auto x = random_vector(rows * W, 112, 2.f);
    if (dt != DType::F32)
      for (auto& v : x) v = bf16_to_float(float_to_bf16(v));
    const auto R = random_vector(rows * W, 113);
    const std::int64_t kept = norm.kept(rows), stats = norm.stats(rows);
    auto run = [&](std::vector<float>* dx) {
      Act qkv = make_act(dt, "qkv", rows * W);
      if (dt == DType::F32) {
        Kokkos::deep_copy(qkv.f, to_device(x));
      } else {
        std::vector<std::uint16_t> w(x.size());
        for (size_t i = 0; i < x.size(); ++i) w[i] = float_to_bf16(x[i]);
        Kokkos::deep_copy(qkv.h, to_device(w));
      }
      FloatView xk = make_float("x", kept), mean = make_float("m", stats), rstd = make_float("r", stats);
      norm.forward(qkv, rows, xk, mean, rstd, make_act(dt, "out", kept));
      if (dx) {
        store.zero_grads();
        FloatView d = to_device(R);
        norm.backward(d, rows, xk, mean, rstd, make_float("dout", kept), make_float("dx", kept));
        *dx = to_host(d);
      }
      if (dt == DType::F32) return to_host(qkv.f);
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), qkv.h);
      std::vector<float> out(h.extent(0));
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(h(i));
      return out;
    };
    // the definition: every query head and key group normalised over its hs channels; v untouched
    std::vector<double> want(x.begin(), x.end());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t h = 0; h < nq + nk; ++h) {
        double ms = 0;
        for (std::int64_t c = 0; c < hs; ++c) ms += static_cast<double>(x[r * W + h * hs + c]) * x[r * W + h * hs + c];
        const double inv = 1.0 / std::sqrt(ms / hs + 1e-6);
        for (std::int64_t c = 0; c < hs; ++c) {
          const double v = x[r * W + h * hs + c] * inv * wv[(h < nq ? 0 : hs) + c];
          want[r * W + h * hs + c] = dt == DType::F32 ? v : bf16_to_float(float_to_bf16(static_cast<float>(v)));
        }
      }
    const auto got = run(nullptr);
    if (dt == DType::F32) {
      expect_close(as_double(got), want, 1e-5, 1e-6, "q/k norm forward");
      std::vector<float> dx;
      run(&dx);
      auto loss = [&] { return dot(run(nullptr), R); };
      std::vector<size_t> idx;
      for (size_t i = 0; i < x.size(); i += 2) idx.push_back(i);
      std::vector<double> g;
      for (auto i : idx) g.push_back(dx[i]);
      expect_close(g, numeric_gradient(x, loss, idx), 2e-3, 2e-3, "q/k norm dx");
    } else {
      // rounded once: at most one bf16 step from the rounded definition (fp32 vs double rstd)
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::abs(got[i] - want[i]), std::abs(want[i]) * 0x1p-7 + 1e-30) << i;
    }
  }
}
