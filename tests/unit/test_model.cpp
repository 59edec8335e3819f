// Whole-model checks: GPT gradients against finite differences of the loss, padding
// independence, layers, AdamW and the LR schedule against their defining formulas.
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "layers/linear.hpp"
#include "models/gpt_model.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "ops/mixed_precision.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {
TransformerConfig tiny(std::int64_t padded) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 2;
  c.ffn_hidden_size = 32;
  c.seq_length = 6;
  c.max_positions = 8;
  c.vocab_size = 37;
  c.padded_vocab = padded;
  c.init_method_std = 0.3f;  // larger than GPT-2's 0.02 so that every path carries gradient signal
  return c;
}
std::vector<std::int32_t> tokens_of(std::int64_t n, std::int64_t V, std::uint64_t seed) {
  CounterRng r(seed);
  std::vector<std::int32_t> t(n);
  for (std::int64_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(r.below_at(i, V));
  return t;
}
}  // namespace

TEST(GptModel, GradientsMatchFiniteDifferencesOfTheMeanLoss) {
  const std::int64_t B = 2;
  ParamStore store;
  GptModel model(tiny(64), store, B);
  store.allocate();
  store.initialize(7);
  const std::int64_t BT = B * 6;
  auto tok = to_device(tokens_of(BT, 37, 1)), tgt = to_device(tokens_of(BT, 37, 2));
  store.zero_grads();
  const float dscale = 1.f / BT;
  model.forward_backward(tok, tgt, dscale);
  auto grads = to_host(store.grads());
  auto values = to_host(store.values());
  auto loss = [&] {
    Kokkos::deep_copy(store.values(),
                      Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()));
    return model.forward(tok, tgt) / BT;
  };
  // Check a sample of entries of every parameter (all of them for the small ones).
  for (const auto& p : store.params()) {
    std::vector<size_t> idx;
    const std::int64_t n = p.numel();
    const std::int64_t rows_valid = p.valid[0] * (p.shape.size() > 1 ? p.shape[1] : 1);
    for (auto i : sample_indices(static_cast<size_t>(rows_valid), 12, std::hash<std::string>()(p.name)))
      idx.push_back(static_cast<size_t>(p.offset) + i);
    (void)n;
    auto num = numeric_gradient(values, loss, idx, 1e-2f);
    std::vector<double> ana;
    for (auto i : idx) ana.push_back(grads[i]);
    // Loss ~ ln(37) ~ 3.6: rounding of the FD is ~6e-8 * 3.6 / 1e-2 ~ 2e-5; truncation dominates.
    expect_close(ana, num, 2e-2, 5e-4, p.name.c_str());
  }
}

TEST(GptModel, LossDoesNotDependOnVocabularyPadding) {
  const std::int64_t B = 2, BT = B * 6;
  auto tok = to_device(tokens_of(BT, 37, 3)), tgt = to_device(tokens_of(BT, 37, 4));
  double losses[2];
  std::vector<float> g[2];
  int k = 0;
  for (std::int64_t padded : {37, 128}) {
    ParamStore store;
    GptModel model(tiny(padded), store, B);
    store.allocate();
    store.initialize(11);
    store.zero_grads();
    losses[k] = model.forward_backward(tok, tgt, 1.f);
    auto all = to_host(store.grads());
    // gradient of the unpadded word embedding rows
    const auto& p = store.info(store.find("model/embedding/word_embeddings"));
    g[k] = std::vector<float>(all.begin() + p.offset, all.begin() + p.offset + 37 * 16);
    ++k;
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-5 * std::fabs(losses[0]));
  for (size_t i = 0; i < g[0].size(); ++i) ASSERT_NEAR(g[0][i], g[1][i], 1e-5) << i;
}

TEST(Linear, MatchesNaiveAndAccumulatesWeightGradients) {
  ParamStore store;
  Linear lin(store, "fc", 3, 4, 0.5f);
  store.allocate();
  store.initialize(5);
  auto x = random_vector(2 * 3, 70), dy = random_vector(2 * 4, 71);
  FloatView y = make_float("y", 8), dx = make_float("dx", 6);
  lin.forward(y, act(to_device(x)), 2);
  auto w = to_host(store.value(store.find("fc/weight")));
  auto out = to_host(y);
  for (int n = 0; n < 2; ++n)
    for (int o = 0; o < 4; ++o) {
      double s = 0;
      for (int i = 0; i < 3; ++i) s += static_cast<double>(x[n * 3 + i]) * w[o * 3 + i];
      EXPECT_NEAR(out[n * 4 + o], s, 1e-5);
    }
  store.zero_grads();
  lin.backward(dx, to_device(dy), act(to_device(x)), 2);
  lin.backward(dx, to_device(dy), act(to_device(x)), 2);  // accumulates twice
  auto gw = to_host(store.grad(store.find("fc/weight")));
  for (int o = 0; o < 4; ++o)
    for (int i = 0; i < 3; ++i) {
      double s = 0;
      for (int n = 0; n < 2; ++n) s += static_cast<double>(dy[n * 4 + o]) * x[n * 3 + i];
      EXPECT_NEAR(gw[o * 3 + i], 2 * s, 1e-5);
    }
}

TEST(AdamW, MatchesTorchAdamWFormula) {
  const std::int64_t n = 4, decay = 2;
  AdamWConfig cfg;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  AdamW opt(cfg, n, decay);
  std::vector<double> p = {0.5, -0.25, 1.0, 2.0}, m(n, 0), v(n, 0);
  auto dp = to_device(std::vector<float>(p.begin(), p.end()));
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g = {0.1f * step, -0.2f, 0.3f, -0.05f * step};
    const double lr = 1e-2 * step;
    const float clip = 0.5f;
    opt.step(dp, to_device(g), lr, clip);
    for (int i = 0; i < n; ++i) {
      const double gi = g[i] * clip;
      if (i < decay) p[i] *= 1 - lr * cfg.weight_decay;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * gi;
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * gi * gi;
      const double bc1 = 1 - std::pow(cfg.beta1, step), bc2 = 1 - std::pow(cfg.beta2, step);
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + cfg.eps);
    }
  }
  auto got = to_host(dp);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(got[i], p[i], 1e-6) << i;
  EXPECT_EQ(opt.steps(), 3);
}

// AdamW's bits are those of its written formula, at every position of a buffer that spans
// vectorised chunk bodies and scalar remainders: m and v by one fused multiply-add each where the
// library's build has FMA (AdamW::fuses_multiply_add), every other operation rounded on its own
// (optim/adamw.cpp, compiled without contraction). Left to the compiler, GCC fused
// p * decay - update once the loop vectorised, which changed every run's bits.
TEST(AdamW, GivesTheBitsOfItsFormulaAtEveryPosition) {
  const std::int64_t n = 2 * 4096 + 37, decay = 4096 + 21;  // the decay boundary inside a chunk
  AdamWConfig cfg;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.weight_decay = 0.1;
  AdamW opt(cfg, n, decay);
  CounterRng rng(7);  // inputs: uniform in [-1, 1)
  auto u = [&](std::uint64_t i) { return static_cast<float>(2.0 * rng.uniform_at(i) - 1.0); };
  std::vector<float> p(n), m(n, 0.f), v(n, 0.f), g(n);
  for (std::int64_t i = 0; i < n; ++i) p[i] = 0.05f * u(i);
  auto dp = to_device(p);
  // one rounding per operation, whatever this file's compiler would contract
  auto r = [](float x) {
    volatile float t = x;
    return static_cast<float>(t);
  };
  auto fused = [&](float a, float b, float c) {
    return AdamW::fuses_multiply_add() ? std::fma(a, b, c) : r(r(a * b) + c);
  };
  for (int step = 1; step <= 4; ++step) {
    for (std::int64_t i = 0; i < n; ++i) g[i] = 0.01f * u(step * n + i);
    const double lr = 3e-3 * step;
    const float scale = step == 3 ? 0.37f : 1.f;
    opt.step(dp, to_device(g), lr, scale);
    // the step's scalars as AdamW::update forms them
    const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
    const float eps = static_cast<float>(cfg.eps);
    const float bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, step));
    const float sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, step)));
    const float step_size = r(static_cast<float>(lr) / bc1);
    const float dec = static_cast<float>(1.0 - lr * cfg.weight_decay);
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = r(g[i] * scale);
      const float pi = i < decay ? r(p[i] * dec) : p[i];
      m[i] = fused(b1, m[i], r(r(1.f - b1) * gi));
      v[i] = fused(b2, v[i], r(r(r(1.f - b2) * gi) * gi));
      p[i] = r(pi - r(r(step_size * m[i]) / r(r(std::sqrt(v[i]) / sqrt_bc2) + eps)));
    }
  }
  const auto gp = to_host(dp), gm = to_host(opt.exp_avg()), gv = to_host(opt.exp_avg_sq());
  auto bits = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  };
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(gm[i]), bits(m[i])) << "first moment " << i;
    ASSERT_EQ(bits(gv[i]), bits(v[i])) << "second moment " << i;
    ASSERT_EQ(bits(gp[i]), bits(p[i])) << "parameter " << i << ": " << gp[i] << " vs " << p[i];
  }
}

// GradsAfter::zero (the trainer's fused gradient zeroing): the update's bits are those of
// GradsAfter::keep, in fp32 and with bf16 masters, and exactly the optimizer's range of the
// gradients becomes zero (a shard inside a larger buffer: nothing outside it is touched).
TEST(AdamW, ZeroingTheGradientsInTheUpdateChangesNothingElse) {
  const std::int64_t total = 3 * 4096 + 11, begin = 1000, n = 2 * 4096 + 5, decay = 5000;
  CounterRng rng(11);
  auto u = [&](std::uint64_t i) { return static_cast<float>(2.0 * rng.uniform_at(i) - 1.0); };
  std::vector<float> p(total), g(total);
  for (std::int64_t i = 0; i < total; ++i) {
    p[i] = 0.05f * u(i);
    g[i] = 0.01f * u(total + i);
  }
  auto bits = [](const std::vector<float>& x) {
    std::vector<std::uint32_t> b(x.size());
    std::memcpy(b.data(), x.data(), x.size() * sizeof(float));
    return b;
  };
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "bf16 masters" : "fp32");
    AdamW keep(AdamWConfig{}, n, decay, begin), zero(AdamWConfig{}, n, decay, begin);
    auto pk = to_device(p), pz = to_device(p);
    HalfView hk = make_half("hk", total), hz = make_half("hz", total);
    if (mixed) {
      pack_half(DType::BF16, hk, pk, total);
      pack_half(DType::BF16, hz, pz, total);
      keep.init_master(DType::BF16, hk);
      zero.init_master(DType::BF16, hz);
    }
    for (int step = 1; step <= 2; ++step) {
      auto gk = to_device(g), gz = to_device(g);
      if (mixed) {
        keep.step_mixed(hk, gk, 1e-3, 0.5f, AdamW::GradsAfter::keep);
        zero.step_mixed(hz, gz, 1e-3, 0.5f, AdamW::GradsAfter::zero);
      } else {
        keep.step(pk, gk, 1e-3, 0.5f, AdamW::GradsAfter::keep);
        zero.step(pz, gz, 1e-3, 0.5f, AdamW::GradsAfter::zero);
      }
      EXPECT_EQ(bits(to_host(gk)), bits(g));
      const auto after = to_host(gz);
      for (std::int64_t i = 0; i < total; ++i) {
        const bool in_range = i >= begin && i < begin + n;
        ASSERT_EQ(after[i], in_range ? 0.f : g[i]) << "gradient " << i;
        if (in_range) ASSERT_FALSE(std::signbit(after[i])) << "gradient " << i;
      }
    }
    EXPECT_EQ(bits(to_host(keep.exp_avg())), bits(to_host(zero.exp_avg())));
    EXPECT_EQ(bits(to_host(keep.exp_avg_sq())), bits(to_host(zero.exp_avg_sq())));
    if (mixed) {
      EXPECT_EQ(bits(to_host(keep.master())), bits(to_host(zero.master())));
      auto hb = [](const HalfView& h) {
        auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), h);
        return std::vector<std::uint16_t>(m.data(), m.data() + m.extent(0));
      };
      EXPECT_EQ(hb(hk), hb(hz));
    } else {
      EXPECT_EQ(bits(to_host(pk)), bits(to_host(pz)));
    }
  }
}

// ParamStore::zero_grads(keep_begin, keep_end) zeroes everything but that range (the trainer
// passes the range the last update zeroed); an empty range zeroes all; a range outside the
// buffer is an error.
TEST(ParamStore, ZeroGradsLeavesOnlyTheGivenRange) {
  ParamStore store;
  GptModel model(tiny(64), store, 1);
  store.allocate();
  const std::int64_t n = store.padded_size(), kb = n / 3, ke = n / 3 + 70001 % (n / 2);
  Kokkos::deep_copy(store.grads(), 2.5f);
  store.zero_grads(kb, ke);
  auto g = to_host(store.grads());
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(g[i], i >= kb && i < ke ? 2.5f : 0.f) << i;
  store.zero_grads();
  g = to_host(store.grads());
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(g[i], 0.f) << i;
  EXPECT_THROW(store.zero_grads(0, n + 1), Error);
  EXPECT_THROW(store.zero_grads(5, 4), Error);
}

TEST(LrSchedule, WarmupThenCosineOrLinearToMin) {
  LrSchedule s;
  s.lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 10;
  s.decay_iters = 110;
  s.style = "cosine";
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.5 * (1 + std::cos(M_PI * 0.5)) * 0.9, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  s.style = "linear";
  EXPECT_NEAR(s.at(35), 0.1 + 0.75 * 0.9, 1e-12);
  s.style = "constant";
  EXPECT_DOUBLE_EQ(s.at(80), 1.0);
}

// LoRA (docs/DESIGN.md "LoRA"): with adapters on every projection the adapters' gradients match
// finite differences of the loss (B made non-zero first, so that A carries gradient too), and the
// frozen projections get no weight gradient.
TEST(GptModel, LoraAdapterGradientsMatchFiniteDifferencesAndTheBaseIsFrozen) {
  const std::int64_t B = 2, BT = B * 6;
  TransformerConfig cfg = tiny(64);
  cfg.lora_rank = 2;
  cfg.lora_scale = 1.5f;
  cfg.lora_targets = {"qkv", "proj", "fc1", "fc2"};
  ParamStore store;
  GptModel model(cfg, store, B);
  store.allocate();
  store.initialize(7);
  auto values = to_host(store.values());
  {  // B = 0 at initialisation: give it values so that every path carries gradient
    CounterRng r(5);
    std::uint64_t k = 0;
    for (const auto& p : store.params())
      if (p.adapter && p.name.size() > 6 && p.name.compare(p.name.size() - 6, 6, "lora_b") == 0)
        for (std::int64_t i = 0; i < p.numel(); ++i)
          values[p.offset + i] = 0.6f * static_cast<float>(r.uniform_at(k++) - 0.5);
  }
  Kokkos::deep_copy(store.values(),
                    Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()));
  auto tok = to_device(tokens_of(BT, 37, 1)), tgt = to_device(tokens_of(BT, 37, 2));
  store.zero_grads();
  model.forward_backward(tok, tgt, 1.f / BT);
  auto grads = to_host(store.grads());
  auto loss = [&] {
    Kokkos::deep_copy(store.values(),
                      Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()));
    return model.forward(tok, tgt) / BT;
  };
  int adapters = 0, frozen = 0;
  for (const auto& p : store.params()) {
    const bool projection_weight = p.name.find("/weight") != std::string::npos &&
                                   (p.name.find("/qkv/") != std::string::npos ||
                                    p.name.find("/proj/") != std::string::npos ||
                                    p.name.find("/fc1/") != std::string::npos ||
                                    p.name.find("/fc2/") != std::string::npos);
    if (projection_weight) {  // frozen: the weight-gradient GEMM is skipped
      for (std::int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(grads[p.offset + i], 0.f) << p.name;
      ++frozen;
    }
    if (!p.adapter) continue;
    ++adapters;
    std::vector<size_t> idx;
    for (auto i : sample_indices(static_cast<size_t>(p.numel()), 12, std::hash<std::string>()(p.name)))
      idx.push_back(static_cast<size_t>(p.offset) + i);
    auto num = numeric_gradient(values, loss, idx, 1e-2f);
    std::vector<double> ana;
    for (auto i : idx) ana.push_back(grads[i]);
    expect_close(ana, num, 2e-2, 5e-4, p.name.c_str());
  }
  EXPECT_EQ(adapters, 2 * 4 * 2);  // layers x projections x (A, B)
  EXPECT_EQ(frozen, 2 * 4);
}

// The store lays the adapters out first, padded, replicated ones last; only they train.
TEST(ParamStore, AdaptersComeFirstAndAloneTrain) {
  TransformerConfig cfg = tiny(64);
  cfg.lora_rank = 3;
  cfg.lora_targets = {"qkv", "fc2"};
  ParamStore store;
  GptModel model(cfg, store, 1);
  store.allocate(4096);
  ASSERT_TRUE(store.has_adapters());
  // qkv: A (3, 16) replicated, B (48, 3); fc2: A (3, 32) sharded like W, B (16, 3) replicated
  const std::int64_t per_layer = 3 * 16 + 48 * 3 + 3 * 32 + 16 * 3;
  EXPECT_EQ(store.global_adapter_count(), 2 * per_layer);
  EXPECT_EQ(store.trainable_size(), 4096);
  EXPECT_EQ(store.adapter_replicated_end(), 2 * per_layer);
  for (const auto& p : store.params()) {
    const ParamId id = store.find(p.name);
    if (p.adapter) {
      EXPECT_LT(p.offset, store.adapter_replicated_end()) << p.name;
      EXPECT_EQ(p.offset >= store.adapter_replicated_begin(), p.tp_replicated) << p.name;
      EXPECT_TRUE(store.trains(id));
    } else {
      EXPECT_GE(p.offset, store.trainable_size()) << p.name;
      EXPECT_FALSE(store.trains(id));
    }
  }
  EXPECT_GE(store.replicated_begin(), store.trainable_size());
}
