// Mixture of experts (ops/moe, layers/moe_mlp, gemm_mixed_grouped): the routing against a
// brute-force top-k with the documented tie rule, its backward against central finite
// differences, the dispatch plan (every selection once, grouped by expert then token, capacity
// drops by probability and by position, an expert without tokens), the permutation followed by
// its inverse, the grouped GEMM against one GEMM per group (bitwise), and a GPT model with MoE
// layers whose gradients match finite differences of its objective (loss + aux + z losses).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "common/half.hpp"
#include "layers/moe_mlp.hpp"
#include "models/gpt_model.hpp"
#include "ops/gemm.hpp"
#include "ops/moe.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {

std::vector<std::int32_t> to_host_int(const IntView& d) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
  return std::vector<std::int32_t>(h.data(), h.data() + h.extent(0));
}

struct Routed {
  std::vector<std::int32_t> idx;
  std::vector<float> probs, lse, ssum, paux;
};

Routed route(const std::vector<float>& logits, std::int64_t R, const RouterSpec& r) {
  IntView idx = make_int("idx", R * r.k);
  FloatView probs = make_float("probs", R * r.k), lse = make_float("lse", R), ssum = make_float("ssum", R),
            paux = make_float("paux", r.E);
  moe_route(idx, probs, lse, ssum, paux, to_device(logits), R, r);
  return {to_host_int(idx), to_host(probs), to_host(lse), to_host(ssum), to_host(paux)};
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The definition in double: experts ordered by (score descending, index ascending), the first k.
void brute_force(const std::vector<float>& logits, std::int64_t R, const RouterSpec& r, std::vector<std::int32_t>& idx,
                 std::vector<double>& probs, std::vector<double>& paux) {
  const std::int64_t E = r.E, k = r.k;
  idx.clear();
  probs.clear();
  paux.assign(static_cast<size_t>(E), 0.0);
  for (std::int64_t t = 0; t < R; ++t) {
    const float* l = logits.data() + t * E;
    double m = l[0], z = 0, ss = 0;
    for (std::int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(l[e]));
    for (std::int64_t e = 0; e < E; ++e) z += std::exp(l[e] - m);
    for (std::int64_t e = 0; e < E; ++e) ss += sigmoid(l[e]);
    std::vector<std::int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [l](std::int32_t a, std::int32_t b) { return l[a] > l[b]; });
    std::vector<double> w;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t e = order[static_cast<size_t>(j)];
      idx.push_back(e);
      w.push_back(r.sigmoid ? sigmoid(l[e]) : r.pre_softmax ? std::exp(l[e] - m) / z : std::exp(l[e]));
    }
    double sum = std::accumulate(w.begin(), w.end(), 0.0);
    const bool norm = r.sigmoid ? k > 1 : !r.pre_softmax;
    for (double x : w) probs.push_back(norm ? x / (sum + (r.sigmoid ? 1e-20 : 0.0)) : x);
    for (std::int64_t e = 0; e < E; ++e)
      paux[static_cast<size_t>(e)] += r.sigmoid ? sigmoid(l[e]) / ss : std::exp(l[e] - m) / z;
  }
}

std::vector<RouterSpec> variants(std::int64_t E) {
  return {{E, 2, false, false}, {E, 3, false, true}, {E, 1, true, false}, {E, 3, true, false}};
}

}  // namespace

TEST(MoeRouting, MatchesBruteForceTopKWithTiesToTheLowerExpert) {
  const std::int64_t R = 40, E = 6;
  auto logits = random_vector(R * E, 31, 1.5f);
  // ties: token 0 all equal, token 1 a tie at the top, token 2 a tie at the k-th place
  for (std::int64_t e = 0; e < E; ++e) logits[e] = 0.25f;
  logits[E + 4] = logits[E + 1] = 3.f;
  logits[2 * E + 0] = 2.f;
  logits[2 * E + 5] = logits[2 * E + 3] = 1.f;
  for (const RouterSpec& r : variants(E)) {
    const Routed got = route(logits, R, r);
    std::vector<std::int32_t> idx;
    std::vector<double> probs, paux;
    brute_force(logits, R, r, idx, probs, paux);
    EXPECT_EQ(got.idx, idx) << "k " << r.k << " sigmoid " << r.sigmoid << " pre " << r.pre_softmax;
    expect_close(as_double(got.probs), probs, 1e-5, 1e-6, "probs");
    expect_close(as_double(got.paux), paux, 1e-5, 1e-5, "paux");
    EXPECT_EQ(got.idx[0], 0);  // all equal: the lowest experts, in order
    EXPECT_EQ(got.idx[static_cast<size_t>(r.k)], 1);
  }
}

TEST(MoeRouting, ExpertBiasSelectsButDoesNotWeigh) {
  // sigmoid routing with an expert bias: the top-k of sigmoid(logit) + bias (ties to the lower
  // expert), the probabilities the chosen sigmoids normalised without the bias
  const std::int64_t R = 30, E = 5, k = 2;
  const auto logits = random_vector(R * E, 37, 1.5f);
  const std::vector<float> bias = {0.3f, -0.2f, 0.f, 0.45f, -0.1f};
  IntView idx = make_int("idx", R * k);
  FloatView probs = make_float("probs", R * k), lse = make_float("lse", R), ssum = make_float("ssum", R),
            paux = make_float("paux", E);
  moe_route(idx, probs, lse, ssum, paux, to_device(logits), R, {E, k, true, false}, to_device(bias));
  const auto got_idx = to_host_int(idx);
  const auto got_probs = as_double(to_host(probs));
  std::int64_t changed = 0;  // tokens whose choice the bias changed (the test must exercise it)
  for (std::int64_t t = 0; t < R; ++t) {
    const float* l = logits.data() + t * E;
    std::vector<std::int32_t> order(static_cast<size_t>(E)), plain(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::iota(plain.begin(), plain.end(), 0);
    const auto key = [&](std::int32_t e) {
      return static_cast<float>(1.f / (1.f + std::exp(-l[e]))) + bias[static_cast<size_t>(e)];
    };
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return key(a) > key(b); });
    std::stable_sort(plain.begin(), plain.end(), [&](std::int32_t a, std::int32_t b) { return l[a] > l[b]; });
    double sum = 0;
    for (std::int64_t j = 0; j < k; ++j) sum += sigmoid(l[order[static_cast<size_t>(j)]]);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t e = order[static_cast<size_t>(j)];
      EXPECT_EQ(got_idx[static_cast<size_t>(t * k + j)], e) << "token " << t;
      EXPECT_NEAR(got_probs[static_cast<size_t>(t * k + j)], sigmoid(l[e]) / (sum + 1e-20), 1e-6);
    }
    changed += (order[0] != plain[0] || order[1] != plain[1]) ? 1 : 0;
  }
  EXPECT_GT(changed, 3);
}

TEST(MoeRouting, BackwardMatchesFiniteDifferences) {
  const std::int64_t R = 5, E = 5;
  auto logits = random_vector(R * E, 41, 1.f);
  for (const RouterSpec& r : variants(E)) {
    auto dprobs = random_vector(R * r.k, 42), aux_grad = random_vector(E, 43);
    const float zg = 0.3f;
    // f = sum dprobs . probs + sum_e aux_grad_e paux_e + zg sum_t lse_t^2
    auto f = [&] {
      const Routed o = route(logits, R, r);
      double v = dot(dprobs, o.probs) + dot(aux_grad, o.paux);
      for (float x : o.lse) v += zg * static_cast<double>(x) * x;
      return v;
    };
    IntView idx = make_int("idx", R * r.k);
    FloatView probs = make_float("probs", R * r.k), lse = make_float("lse", R), ssum = make_float("ssum", R),
              paux = make_float("paux", E), dl = make_float("dl", R * E);
    const FloatView lv = to_device(logits);
    moe_route(idx, probs, lse, ssum, paux, lv, R, r);
    moe_route_backward(dl, to_device(dprobs), lv, lse, ssum, idx, probs, to_device(aux_grad), zg, R, r);
    std::vector<size_t> all(static_cast<size_t>(R * E));
    std::iota(all.begin(), all.end(), 0);
    auto num = numeric_gradient(logits, f, all, 1e-3f);
    expect_close(as_double(to_host(dl)), num, 5e-3, 5e-3, "dlogits");
  }
}

TEST(MoePlan, EverySelectionOnceGroupedByExpertThenToken) {
  const std::int64_t R = 30, E = 5, k = 2;
  auto logits = random_vector(R * E, 51, 2.f);
  for (std::int64_t t = 0; t < R; ++t) logits[t * E + 3] = -50.f;  // expert 3 receives no token
  const Routed o = route(logits, R, {E, k, false, false});
  const MoePlan p = moe_plan(o.idx.data(), o.probs.data(), R, k, E, 0, true);
  EXPECT_EQ(p.rows(), R * k);
  EXPECT_EQ(p.dropped(), 0);
  EXPECT_EQ(p.counts[3], 0);
  EXPECT_EQ(p.routed, p.counts);
  std::vector<int> used(static_cast<size_t>(R * k), 0);
  for (std::int64_t s = 0; s < R * k; ++s) {
    const std::int32_t n = p.slot_row[static_cast<size_t>(s)];
    ASSERT_GE(n, 0);
    ++used[static_cast<size_t>(n)];
    EXPECT_EQ(p.row_token[static_cast<size_t>(n)], s / k);
    const std::int64_t e = o.idx[static_cast<size_t>(s)];
    EXPECT_GE(n, p.offsets[static_cast<size_t>(e)]);
    EXPECT_LT(n, p.offsets[static_cast<size_t>(e + 1)]);
  }
  for (int u : used) EXPECT_EQ(u, 1);
  for (std::int64_t n = 1; n < p.rows(); ++n)  // tokens ascending inside each expert's rows
    if (std::find(p.offsets.begin(), p.offsets.end(), n) == p.offsets.end())
      EXPECT_LT(p.row_token[static_cast<size_t>(n - 1)], p.row_token[static_cast<size_t>(n)]);
}

TEST(MoePlan, CapacityDropsByProbabilityOrByPosition) {
  // 5 tokens, 3 experts, k = 1; expert 0 is chosen by tokens 0, 1, 3, 4 with probabilities
  // .5 .9 .9 .7, expert 1 by token 2, expert 2 by none; capacity 2
  const std::vector<std::int32_t> idx = {0, 0, 1, 0, 0};
  const std::vector<float> probs = {.5f, .9f, .6f, .9f, .7f};
  EXPECT_EQ(moe_capacity(5, 1, 3, 1.2), 2);  // ceil(5 / 3 x 1.2)
  const MoePlan byp = moe_plan(idx.data(), probs.data(), 5, 1, 3, 2, true);
  EXPECT_EQ(byp.counts, (std::vector<std::int64_t>{2, 1, 0}));
  EXPECT_EQ(byp.routed, (std::vector<std::int64_t>{4, 1, 0}));
  EXPECT_EQ(byp.dropped(), 2);
  // the two largest of expert 0 (.9 at tokens 1 and 3: a tie, both kept), in token order
  EXPECT_EQ(byp.slot_row, (std::vector<std::int32_t>{-1, 0, 2, 1, -1}));
  const MoePlan bypos = moe_plan(idx.data(), probs.data(), 5, 1, 3, 2, false);
  EXPECT_EQ(bypos.slot_row, (std::vector<std::int32_t>{0, 1, 2, -1, -1}));  // its first two tokens
  // a tie at the capacity edge goes to the lower token
  const std::vector<float> tied = {.8f, .8f, .6f, .8f, .1f};
  const MoePlan t = moe_plan(idx.data(), tied.data(), 5, 1, 3, 2, true);
  EXPECT_EQ(t.slot_row, (std::vector<std::int32_t>{0, 1, 2, -1, -1}));
}

TEST(MoePlan, PermutationThenItsInverseIsTheIdentity) {
  const std::int64_t R = 24, E = 4, k = 2, C = 7;
  auto logits = random_vector(R * E, 61, 2.f);
  const Routed o = route(logits, R, {E, k, false, false});
  const MoePlan p = moe_plan(o.idx.data(), o.probs.data(), R, k, E, 0, true);
  const auto x = random_vector(R * C, 62);
  const IntView rt = to_device(p.row_token), sr = to_device(p.slot_row);
  FloatView xp = make_float("xp", R * k * C), back = make_float("back", R * C), dx = make_float("dx", R * C);
  moe_gather(act(xp), act(to_device(x)), rt, p.rows(), C);
  // combining the permuted rows with weights 1/2 (k = 2: exact) gives x back
  moe_combine(back, xp, to_device(std::vector<float>(static_cast<size_t>(R * k), 0.5f)), sr, R, k, C);
  EXPECT_EQ(to_host(back), x);
  // the gather's adjoint adds each token's k rows: 2x
  moe_scatter_add(dx, xp, sr, R, k, C);
  auto twice = x;
  for (auto& v : twice) v *= 2.f;
  EXPECT_EQ(to_host(dx), twice);
}

// The experts' grouped GEMM against one gemm_mixed per group at one thread, bit for bit: at 1 and
// 2 threads (at 2 the groups are shared out over the threads, or, with one group large enough for
// gemm()'s own split into slabs, run one after another), forward (N x T) and weight-gradient
// (T x N, beta 1, a group of K = 0 kept by beta) shapes, fp32, bf16 and fp16 operands. On AVX2
// CPUs, where a cut into slabs may change the bits, the reference runs at the test's thread count.
TEST(GemmGrouped, EachGroupHasTheBitsOfItsOwnGemmAtOneThread) {
  struct Case {
    std::int64_t K, N;
    std::vector<std::int64_t> rows;
  };
  int checked = 0;
  for (const Case& c : {Case{24, 16, {5, 0, 17, 1, 9}}, Case{64, 48, {3, 40, 2, 7, 0, 11, 29, 1}},
                        Case{256, 768, {700, 3, 9}}})  // the last: one group split into slabs at 2 threads
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (int weight_grad = 0; weight_grad < 2; ++weight_grad)
        for (int threads : {1, 2}) {
          const std::int64_t K = c.K, N = c.N, E = static_cast<std::int64_t>(c.rows.size());
          const std::int64_t M = std::accumulate(c.rows.begin(), c.rows.end(), std::int64_t{0});
          auto a = random_vector(M * K, 71), w = random_vector(E * N * K, 72), dy = random_vector(M * N, 73);
          const auto operands = [&](const std::vector<float>& v) {
            if (dt == DType::F32) return act(to_device(v));
            std::vector<std::uint16_t> h(v.size());
            for (size_t i = 0; i < v.size(); ++i) h[i] = dt == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
            return Act(dt, to_device(h));
          };
          const Act A = operands(a), W = operands(w), DY = operands(dy);
          // forward: y_e (rows, N) = x_e W_e^T; weight gradient: dW_e (N, K) += dy_e^T x_e
          const std::int64_t out = weight_grad ? E * N * K : M * N;
          const auto init = random_vector(out, 74);
          FloatView grouped = to_device(init), single = to_device(init);
          std::vector<GemmGroup> g;
          std::int64_t m0 = 0;
          for (std::int64_t e = 0; e < E; ++e) {
            const std::int64_t r = c.rows[static_cast<size_t>(e)];
            if (weight_grad)
              g.push_back(
                  {N, K, r, operand(DY).at(m0 * N), N, operand(A).at(m0 * K), K, grouped.data() + e * N * K, K});
            else
              g.push_back({r, N, K, operand(A).at(m0 * K), K, operand(W).at(e * N * K), K, grouped.data() + m0 * N, N});
            m0 += r;
          }
          const Trans ta = weight_grad ? Trans::T : Trans::N, tb = weight_grad ? Trans::N : Trans::T;
          const float beta = weight_grad ? 1.f : 0.f;
          at_threads(threads, [&] { gemm_mixed_grouped(ta, tb, 1.f, beta, g); });
          // one thread's bits where a cut keeps them (oneDNN's AVX-512 kernels; proxy: it has a
          // bf16 matmul); on AVX2 CPUs a group large enough to be cut into slabs has the slabs'
          // (ops/gemm.cpp), so there the reference runs at the same thread count
#if defined(TRIDENT_ENABLE_CUDA)
          const int reference_threads = 1;  // host threads play no part
#else
          const int reference_threads = gemm_bf16_native() ? 1 : threads;
#endif
          at_threads(reference_threads, [&] {
            for (const GemmGroup& x : g)
              if (x.M > 0 && x.N > 0 && x.K > 0)
                gemm_mixed(ta, tb, x.M, x.N, x.K, 1.f, x.A, x.lda, x.B, x.ldb, beta,
                           single.data() + (x.C - grouped.data()), x.ldc);
          });
          Kokkos::fence();
          const auto gv = to_host(grouped), sv = to_host(single);
          ASSERT_EQ(0, std::memcmp(gv.data(), sv.data(), gv.size() * sizeof(float)))
              << dtype_name(dt) << " K " << K << " N " << N << " weight_grad " << weight_grad << " threads " << threads;
          ASSERT_NE(float_bits(gv.back()), float_bits(init.back()));  // the last group really ran
          ++checked;
        }
  EXPECT_EQ(checked, 36);
}

namespace {
std::vector<std::int32_t> tokens_of_seed(std::int64_t n, std::int64_t V, std::uint64_t seed) {
  CounterRng r(seed);
  std::vector<std::int32_t> t(static_cast<size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<std::int32_t>(r.below_at(i, V));
  return t;
}

TransformerConfig moe_tiny(bool swiglu, std::int64_t shared, double capacity) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 2;
  c.ffn_hidden_size = 24;
  c.seq_length = 6;
  c.max_positions = 8;
  c.vocab_size = 37;
  c.padded_vocab = 64;
  c.init_method_std = 0.3f;
  c.swiglu = swiglu;
  c.add_bias_linear = !swiglu;
  c.moe.num_experts = 4;
  c.moe.router_topk = 2;
  c.moe.ffn_hidden_size = 8;
  c.moe.shared_expert_intermediate_size = shared;
  c.moe.aux_loss_coeff = 0.5;
  c.moe.z_loss_coeff = 0.1;
  c.moe.expert_capacity_factor = capacity;
  c.moe.layers = {1, 0};  // layer 0 MoE, layer 1 dense
  GptModel::set_spec(c);
  return c;
}
}  // namespace

// The objective a single micro-batch's gradient differentiates: the mean token loss plus, per MoE
// layer, aux_grad_scale (aux_loss_coeff aux + z_loss_coeff z).
TEST(MoeModel, GradientsMatchFiniteDifferencesOfLossPlusRouterLosses) {
  for (const auto& [swiglu, shared, capacity] :
       {std::tuple<bool, std::int64_t, double>{false, 0, 0.0}, {true, 8, 0.0}, {true, 0, 0.5}}) {
    const std::int64_t B = 2, BT = B * 6;
    const TransformerConfig cfg = moe_tiny(swiglu, shared, capacity);
    ParamStore store;
    GptModel model(cfg, store, B);
    store.allocate();
    store.initialize(11);
    MoeState* st = model.moe_state();
    ASSERT_NE(st, nullptr);
    st->aux_grad_scale = 0.7f;
    auto tok = to_device(tokens_of_seed(BT, 37, 3)), tgt = to_device(tokens_of_seed(BT, 37, 4));
    store.zero_grads();
    model.forward_backward(tok, tgt, 1.f / BT);
    ASSERT_EQ(st->layers.size(), 1u);
    EXPECT_EQ(st->layers.at(0).micro, 1);
    if (capacity > 0) EXPECT_GT(st->layers.at(0).dropped, 0);  // ceil(12 x 2 / 4 x 0.5) = 3 per expert: some drop
    auto grads = to_host(store.grads());
    auto values = to_host(store.values());
    auto objective = [&] {
      Kokkos::deep_copy(store.values(),
                        Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()));
      const double loss = model.forward(tok, tgt) / BT;
      const auto [aux, z] = st->last_forward.at(0);
      return loss + 0.7 * (0.5 * aux + 0.1 * z);
    };
    for (const auto& p : store.params()) {
      if (p.name.find("/mlp/") == std::string::npos) continue;  // the MoE layer's and the dense MLP's
      std::vector<size_t> idx;
      for (auto i : sample_indices(static_cast<size_t>(p.numel()), 6, std::hash<std::string>()(p.name)))
        idx.push_back(static_cast<size_t>(p.offset) + i);
      auto num = numeric_gradient(values, objective, idx, 1e-2f);
      std::vector<double> ana;
      for (auto i : idx) ana.push_back(grads[i]);
      expect_close(ana, num, 2e-2, 5e-4, p.name.c_str());
    }
  }
}
