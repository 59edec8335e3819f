// Document-aware packing (docs/DESIGN.md "Packed sequences"; deck data.reset_position_ids,
// reset_attention_mask, eod_mask_loss):
//   - the attention's document bound (AttentionMask::doc_start) in the unfused masked softmax and
//     the fused kernels: the forward against each document's own attention in double, the
//     backward against finite differences and between the two paths, dropout included, and the
//     fused kernel in bf16 storage;
//   - learned positions per token (add_positions with positions) and their backward;
//   - Batch::finish's staging of positions, document starts and masked targets (Megatron's
//     get_ltor_masks_and_position_ids), and of BERT's padding as lengths (cuDNN's padding mask);
//   - a packed GPT micro-batch (GPT-2's layer and the Llama-family layer) equal to its documents
//     run one by one: loss and every gradient within fp32 tolerance.
#include <cmath>
#include <cstdio>

#include "common/error.hpp"
#include "common/half.hpp"
#include "models/gpt_generator.hpp"
#include "models/gpt_model.hpp"
#include "ops/attention.hpp"
#include "ops/embedding.hpp"
#include "ops/flash_attention.hpp"
#include "test_helpers.hpp"
#include "train/family_task.hpp"

using namespace trident;
using namespace trident::test;

namespace {

// Documents of sample 0: [0, 4) [4, 9) [9, 11); sample 1: one document [0, 11); sample 2:
// [0, 1) [1, 11) (a one-token document first).
const std::vector<std::int32_t> kDocStart = {0, 0, 0, 0, 4, 4, 4, 4, 4, 9, 9,  //
                                             0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                             0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// Self-attention in double of qkv (B, T, 3C) where query t of sample b attends to keys
// doc_start[b T + t] .. t: each document's own causal attention.
std::vector<double> document_attention(const std::vector<float>& qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                                       std::int64_t nh, const std::vector<std::int32_t>& doc) {
  const std::int64_t hs = C / nh;
  std::vector<double> y(static_cast<size_t>(B * T * C), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t j0 = doc[static_cast<size_t>(b * T + i)];
        std::vector<double> s;
        double mx = -1e300;
        for (std::int64_t j = j0; j <= i; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < hs; ++c)
            d += static_cast<double>(qkv[static_cast<size_t>((b * T + i) * 3 * C + h * hs + c)]) *
                 qkv[static_cast<size_t>((b * T + j) * 3 * C + C + h * hs + c)];
          s.push_back(d / std::sqrt(static_cast<double>(hs)));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (std::int64_t j = j0; j <= i; ++j)
          for (std::int64_t c = 0; c < hs; ++c)
            y[static_cast<size_t>((b * T + i) * C + h * hs + c)] +=
                s[static_cast<size_t>(j - j0)] / sum *
                qkv[static_cast<size_t>((b * T + j) * 3 * C + 2 * C + h * hs + c)];
      }
  return y;
}

std::vector<std::int32_t> ints(const IntView& d) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
  return std::vector<std::int32_t>(h.data(), h.data() + h.extent(0));
}

AttentionMask doc_mask() {
  AttentionMask m;
  m.doc_start = to_device(kDocStart);
  return m;
}

}  // namespace

// Both paths' forward against each document's own attention; their backward passes agree, with
// and without dropout.
TEST(PackedAttention, DocumentBoundInBothPaths) {
  const AttentionShape s{3, 11, 16, 2};
  const std::int64_t BT = s.B * s.T, A = s.B * s.nh * s.T * s.T;
  const auto qkv_h = random_vector(BT * 3 * s.C, 71), dy_h = random_vector(BT * s.C, 72);
  const FloatView qkv = to_device(qkv_h), dy = to_device(dy_h);
  const AttentionMask mask = doc_mask();
  const auto want = document_attention(qkv_h, s.B, s.T, s.C, s.nh, kDocStart);
  for (const float p : {0.f, 0.25f}) {
    DropoutSpec d;
    d.p = p;
    d.key = 24681357;
    FloatView y_ref = make_float("y_ref", BT * s.C), att = make_float("att", A), att_drop = make_float("att_drop", A);
    FloatView datt = make_float("datt", A), dqkv_ref = make_float("dqkv_ref", BT * 3 * s.C);
    attention_forward(y_ref, qkv, att, s, d, att_drop, mask);
    attention_backward(dqkv_ref, dy, qkv, att, att_drop, datt, s, d, mask);
    Act y = make_act(DType::F32, "y", BT * s.C), q = act(qkv);
    FloatView lse = make_float("lse", s.B * s.nh * s.T), delta = make_float("delta", s.B * s.nh * s.T);
    FloatView dqkv = make_float("dqkv", BT * 3 * s.C);
    flash_attention_forward(y, lse, q, s, d, mask);
    flash_attention_backward(dqkv, dy, q, y, lse, delta, s, d, mask);
    if (p == 0.f) {
      expect_close(as_double(to_host(y_ref)), want, 1e-5, 1e-6, "unfused forward vs documents in double");
      expect_close(as_double(to_host(y.f)), want, 1e-5, 1e-6, "flash forward vs documents in double");
    }
    expect_close(as_double(to_host(y.f)), as_double(to_host(y_ref)), 2e-5, 2e-6, "flash vs unfused forward");
    expect_close(as_double(to_host(dqkv)), as_double(to_host(dqkv_ref)), 2e-5, 1e-5, "flash vs unfused backward");
    // no gradient crosses a document boundary: a key of document [4, 9) of sample 0 gets none
    // from the queries of [9, 11), so perturbing those queries' output gradient changes nothing
    auto dy2 = dy_h;
    for (std::int64_t t = 9; t < 11; ++t)
      for (std::int64_t c = 0; c < s.C; ++c) dy2[static_cast<size_t>(t * s.C + c)] += 1.f;
    FloatView dqkv2 = make_float("dqkv2", BT * 3 * s.C);
    flash_attention_backward(dqkv2, to_device(dy2), q, y, lse, delta, s, d, mask);
    const auto g1 = to_host(dqkv), g2 = to_host(dqkv2);
    for (std::int64_t t = 0; t < 9; ++t)
      for (std::int64_t c = s.C; c < 3 * s.C; ++c)
        ASSERT_EQ(g1[static_cast<size_t>(t * 3 * s.C + c)], g2[static_cast<size_t>(t * 3 * s.C + c)]) << t << " " << c;
  }
}

// The fused kernel's backward under the document bound against central differences.
TEST(PackedAttention, FlashBackwardMatchesFiniteDifferences) {
  const AttentionShape s{3, 11, 8, 2};
  const std::int64_t BT = s.B * s.T;
  const AttentionMask mask = doc_mask();
  auto qkv_h = random_vector(BT * 3 * s.C, 81);
  const auto R = random_vector(BT * s.C, 82);
  auto run = [&](const std::vector<float>& in, Act& y) {
    FloatView lse = make_float("lse", s.B * s.nh * s.T);
    y = make_act(DType::F32, "y", BT * s.C);
    flash_attention_forward(y, lse, act(to_device(in)), s, {}, mask);
    return lse;
  };
  Act y;
  FloatView lse = run(qkv_h, y);
  FloatView dqkv = make_float("dqkv", BT * 3 * s.C), delta = make_float("delta", s.B * s.nh * s.T);
  flash_attention_backward(dqkv, to_device(R), act(to_device(qkv_h)), y, lse, delta, s, {}, mask);
  std::vector<size_t> idx;
  for (size_t i = 0; i < qkv_h.size(); i += 5) idx.push_back(i);
  auto loss = [&] {
    Act yy;
    run(qkv_h, yy);
    return dot(to_host(yy.f), R);
  };
  const auto g = to_host(dqkv);
  std::vector<double> got;
  for (auto i : idx) got.push_back(g[i]);
  expect_close(got, numeric_gradient(qkv_h, loss, idx), 2e-3, 2e-3,
               "flash backward with documents vs finite differences");
}

// bf16 storage under the document bound: the fp32 function of the rounded inputs, rounded once.
TEST(PackedAttention, Bf16FlashMatchesFp32OnRoundedInputs) {
  const AttentionShape s{3, 11, 32, 2};
  const std::int64_t BT = s.B * s.T;
  auto qkv_h = random_vector(BT * 3 * s.C, 91);
  auto hq = Kokkos::create_mirror_view(make_half("q16", BT * 3 * s.C));
  for (size_t i = 0; i < qkv_h.size(); ++i) qkv_h[i] = bf16_to_float(hq(i) = float_to_bf16(qkv_h[i]));
  Act q16;
  q16.dt = DType::BF16;
  q16.h = make_half("q16d", BT * 3 * s.C);
  Kokkos::deep_copy(q16.h, hq);
  Act y16 = make_act(DType::BF16, "y16", BT * s.C), y32 = make_act(DType::F32, "y32", BT * s.C);
  FloatView lse = make_float("lse", s.B * s.nh * s.T);
  const AttentionMask mask = doc_mask();
  flash_attention_forward(y16, lse, q16, s, {}, mask);
  flash_attention_forward(y32, lse, act(to_device(qkv_h)), s, {}, mask);
  auto a = Kokkos::create_mirror_view_and_copy(HostSpace(), y16.h);
  const auto b = to_host(y32.f);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(a(i), float_to_bf16(b[i])) << i;
}

// Learned positions per token: the rows of the table the positions name, and the backward
// summing each position's rows (in row order: exact here, the values being small integers).
TEST(PackedPositions, LearnedPositionsPerToken) {
  const std::int64_t R = 6, C = 3, P = 5;
  const std::vector<std::int32_t> pos = {0, 1, 0, 1, 2, 0};
  std::vector<float> wpe(P * C), dx(R * C);
  for (std::int64_t i = 0; i < P * C; ++i) wpe[static_cast<size_t>(i)] = static_cast<float>(i);
  for (std::int64_t i = 0; i < R * C; ++i) dx[static_cast<size_t>(i)] = static_cast<float>(i % 7);
  FloatView x = make_float("x", R * C);
  add_positions(x, act(to_device(wpe)), 0, R, 4, C, to_device(pos));
  const auto got = to_host(x);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c)
      EXPECT_EQ(got[static_cast<size_t>(r * C + c)], wpe[static_cast<size_t>(pos[static_cast<size_t>(r)] * C + c)]);
  FloatView dwpe = make_float("dwpe", P * C);
  add_positions_backward(dwpe, to_device(dx), 0, R, 4, C, to_device(pos));
  std::vector<float> want(P * C, 0.f);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c)
      want[static_cast<size_t>(pos[static_cast<size_t>(r)] * C + c)] += dx[static_cast<size_t>(r * C + c)];
  EXPECT_EQ(to_host(dwpe), want);
  // rows held from row0 on (sequence parallelism) read the positions of their global rows
  FloatView x2 = make_float("x2", 2 * C);
  add_positions(x2, act(to_device(wpe)), 3, 2, 4, C, to_device(pos));
  const auto got2 = to_host(x2);
  for (std::int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(got2[static_cast<size_t>(c)], wpe[static_cast<size_t>(1 * C + c)]);
    EXPECT_EQ(got2[static_cast<size_t>(C + c)], wpe[static_cast<size_t>(2 * C + c)]);
  }
}

// Batch::finish stages Megatron's positions, document starts and loss mask: after the
// end-of-document token at input position i, positions restart and the first attended key is
// i + 1; the prediction made at the end-of-document input carries no loss (eod_mask_loss).
TEST(PackedBatch, StagingFollowsMegatron) {
  const std::int64_t B = 2, S = 6;
  const std::int32_t E = 9;  // the end-of-document id
  Batch batch(B, S, ModelFamily::Gpt);
  batch.set_packing(true, true, true, E);
  batch.window = {1, 2, E, 3, 4, E, 5,   // sample 0: documents [0, 3) [3, 6)
                  E, 6, 7, 8, 1, 2, 3};  // sample 1: [0, 1) [1, 6)
  MicroBatch mb;
  mb.tokens = make_int("t", B * S);
  mb.targets = make_int("y", B * S);
  mb.positions = make_int("p", B * S);
  mb.doc_start = make_int("d", B * S);
  batch.finish(10, mb);
  EXPECT_EQ(ints(mb.positions), (std::vector<std::int32_t>{0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 3, 4}));
  EXPECT_EQ(ints(mb.doc_start), (std::vector<std::int32_t>{0, 0, 0, 3, 3, 3, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(ints(mb.targets), (std::vector<std::int32_t>{2, E, -1, 4, E, -1, -1, 7, 8, 1, 2, 3}));
  EXPECT_EQ(mb.num_targets, 9);
  // without eod_mask_loss every target counts; without the resets nothing else is staged
  Batch plain(B, S, ModelFamily::Gpt);
  plain.set_packing(false, false, false, E);
  plain.window = batch.window;
  MicroBatch mb2;
  mb2.tokens = make_int("t2", B * S);
  mb2.targets = make_int("y2", B * S);
  plain.finish(10, mb2);
  EXPECT_EQ(mb2.num_targets, B * S);
  EXPECT_EQ(ints(mb2.targets)[2], 3);
  // packing needs the corpus's end-of-document id
  Batch none(B, S, ModelFamily::Gpt);
  EXPECT_THROW(none.set_packing(false, true, false, -1), Error);
}

// BERT's padding goes also as one length per sample (MicroBatch::padding_len, cuDNN's padding mask)
// where every sample's valid positions are a prefix of at least one: not with a hole, not for an
// empty sample, and not where the micro-batch has no room for them (a host model's).
TEST(PackedBatch, BertPaddingGoesAsLengthsWherePrefixes) {
  const std::int64_t B = 2, S = 4;
  Batch batch(B, S, ModelFamily::Bert);
  ASSERT_EQ(batch.width, 4 * S + 1);
  const auto record = [&](std::vector<std::int32_t> pad0, std::vector<std::int32_t> pad1) {
    std::vector<std::int32_t> w;
    for (const auto* pad : {&pad0, &pad1}) {
      for (std::int64_t t = 0; t < S; ++t) w.push_back(static_cast<std::int32_t>(t + 1));  // tokens
      for (std::int64_t t = 0; t < S; ++t) w.push_back(0);                                 // types
      for (std::int64_t t = 0; t < S; ++t) w.push_back(t == 1 ? 3 : -1);                   // labels
      w.insert(w.end(), pad->begin(), pad->end());
      w.push_back(0);  // sentence order
    }
    return w;
  };
  MicroBatch mb;
  mb.tokens = make_int("t", B * S);
  mb.targets = make_int("y", B * S);
  mb.types = make_int("ty", B * S);
  mb.padding = make_int("pad", B * S);
  mb.sentence_order = make_int("so", B);
  mb.padding_len = make_int("len", B);
  batch.window = record({1, 1, 1, 0}, {1, 1, 0, 0});
  batch.finish(10, mb);
  EXPECT_TRUE(mb.padding_lengths);
  EXPECT_EQ(ints(mb.padding_len), (std::vector<std::int32_t>{3, 2}));
  EXPECT_EQ(ints(mb.padding), (std::vector<std::int32_t>{1, 1, 1, 0, 1, 1, 0, 0}));
  batch.window = record({1, 1, 1, 1}, {1, 0, 1, 0});  // a hole
  batch.finish(10, mb);
  EXPECT_FALSE(mb.padding_lengths);
  batch.window = record({1, 1, 1, 1}, {0, 0, 0, 0});  // an empty sample
  batch.finish(10, mb);
  EXPECT_FALSE(mb.padding_lengths);
  batch.window = record({1, 1, 1, 1}, {1, 1, 1, 1});
  batch.finish(10, mb);
  EXPECT_TRUE(mb.padding_lengths);
  EXPECT_EQ(ints(mb.padding_len), (std::vector<std::int32_t>{4, 4}));
  mb.padding_len = IntView();
  batch.finish(10, mb);
  EXPECT_FALSE(mb.padding_lengths);
}

// Instruction fine-tuning records (data/sft_dataset.hpp: tokens, targets, conversation per
// position): positions and attention restart where the conversation index changes (padding, -1, is
// a span of its own); the targets are staged as given and counted where >= 0.
TEST(PackedBatch, SftRecordsStageConversations) {
  const std::int64_t B = 2, S = 5;
  Batch batch(B, S, ModelFamily::Gpt, 0, /*sft=*/true);
  ASSERT_EQ(batch.width, 3 * S);
  batch.set_packing(true, true, false, -1);                                      // no end-of-document id needed
  batch.window = {4, 5, 6, 7, 8, /**/ -1, 6, -1, 8,  -1, /**/ 0, 0, 0, 1,  1,    // conversations [0, 3) [3, 5)
                  1, 2, 3, 9, 9, /**/ 2,  3, -1, -1, -1, /**/ 0, 0, 0, -1, -1};  // one, then padding
  MicroBatch mb;
  mb.tokens = make_int("t", B * S);
  mb.targets = make_int("y", B * S);
  mb.positions = make_int("p", B * S);
  mb.doc_start = make_int("d", B * S);
  batch.finish(10, mb);
  EXPECT_EQ(ints(mb.tokens), (std::vector<std::int32_t>{4, 5, 6, 7, 8, 1, 2, 3, 9, 9}));
  EXPECT_EQ(ints(mb.targets), (std::vector<std::int32_t>{-1, 6, -1, 8, -1, 2, 3, -1, -1, -1}));
  EXPECT_EQ(ints(mb.positions), (std::vector<std::int32_t>{0, 1, 2, 0, 1, 0, 1, 2, 0, 1}));
  EXPECT_EQ(ints(mb.doc_start), (std::vector<std::int32_t>{0, 0, 0, 3, 3, 0, 0, 0, 3, 3}));
  EXPECT_EQ(mb.num_targets, 4);
  // a target outside the vocabulary is refused like a token
  batch.window[S + 1] = 10;
  EXPECT_THROW(batch.finish(10, mb), Error);
}

namespace {

constexpr std::int64_t kS = 12, kV = 29, kC = 16;
constexpr std::int32_t kEod = 28;

TransformerConfig packed_config(bool llama) {
  TransformerConfig c;
  GptModel::set_spec(c);
  c.num_layers = 2;
  c.hidden_size = kC;
  c.num_heads = 4;
  c.ffn_hidden_size = 24;
  c.seq_length = kS;
  c.max_positions = 16;
  c.vocab_size = kV;
  c.padded_vocab = 32;
  c.init_method_std = 0.3f;
  if (llama) {
    c.normalization = "RMSNorm";
    c.position_embedding_type = "rope";
    c.swiglu = true;
    c.add_bias_linear = false;
    c.num_query_groups = 2;
    c.untie_embeddings_and_output_weights = true;
  }
  c.reset_position_ids = c.reset_attention_mask = true;
  return c;
}

// The summed loss (the GPT head without per-target mean) and gradient of one micro-batch of B
// samples, each staged by Batch::finish from its record with packing on: GPT windows (documents
// ended by kEod, eod_mask_loss), or instruction fine-tuning records (sft: tokens, targets,
// conversation index). seed: the parameters' initialisation.
std::pair<double, std::vector<float>> run_windows(const TransformerConfig& cfg, const std::vector<std::int32_t>& w,
                                                  std::int64_t B, bool flash, bool sft = false,
                                                  std::uint64_t seed = 5) {
  TransformerConfig c = cfg;
  c.flash_attention = flash;
  ParamStore store;
  GptModel model(c, store, B);
  store.allocate();
  store.initialize(seed);
  store.zero_grads();
  MicroBatch mb = model.allocate_micro_batch();
  Batch batch(B, kS, ModelFamily::Gpt, 0, sft);
  batch.set_packing(true, true, !sft, sft ? -1 : kEod);
  batch.window = w;
  batch.finish(kV, mb);
  const double loss = model.forward_backward(mb, 1.f);
  return {loss, to_host(store.grads())};
}

}  // namespace

// One window of three documents against each document alone in a window of its own, the rest of
// that window end-of-document tokens (whose predictions carry no loss and which, as documents of
// their own, are attended to by nothing else): equal summed losses and gradients. The last
// document ends the window in both (its final target is the token after the window).
TEST(PackedGpt, PackedBatchEqualsDocumentsOneByOne) {
  // documents: 4 tokens + EOD, 3 tokens + EOD, 4 tokens (the window's tail)
  const std::vector<std::vector<std::int32_t>> docs = {{3, 7, 1, 12, kEod}, {5, 5, 20, kEod}, {8, 2, 17, 4}};
  std::vector<std::int32_t> packed;
  for (const auto& d : docs) packed.insert(packed.end(), d.begin(), d.end());
  ASSERT_EQ(static_cast<std::int64_t>(packed.size()), kS + 1);
  std::vector<std::int32_t> alone;
  for (size_t k = 0; k < docs.size(); ++k) {
    std::vector<std::int32_t> w(static_cast<size_t>(kS + 1), kEod);
    const auto& d = docs[k];
    const size_t at = k + 1 < docs.size() ? 0 : w.size() - d.size();  // the tail document last
    std::copy(d.begin(), d.end(), w.begin() + static_cast<std::ptrdiff_t>(at));
    alone.insert(alone.end(), w.begin(), w.end());
  }
  for (const bool llama : {false, true})
    for (const bool flash : {false, true}) {
      const TransformerConfig cfg = packed_config(llama);
      const auto [packed_loss, packed_grads] = run_windows(cfg, packed, 1, flash);
      const auto [alone_loss, alone_grads] = run_windows(cfg, alone, 3, flash);
      const std::string what = std::string(llama ? "Llama" : "GPT-2") + (flash ? " flash" : " unfused");
      EXPECT_NEAR(packed_loss, alone_loss, 1e-5 * std::abs(packed_loss)) << what;
      // the same terms summed in other orders (other GEMM shapes): fp32 rounding of O(1) products,
      // measured worst relative L2 error over the whole gradient ~1e-6
      double d2 = 0, n2 = 0, gmax = 0;
      for (size_t i = 0; i < alone_grads.size(); ++i) {
        d2 += std::pow(static_cast<double>(packed_grads[i]) - alone_grads[i], 2);
        n2 += std::pow(static_cast<double>(alone_grads[i]), 2);
        gmax = std::max(gmax, std::abs(static_cast<double>(alone_grads[i])));
      }
      std::printf("%s: packed vs one by one: loss %.9g vs %.9g, gradient relative L2 difference %.2e\n", what.c_str(),
                  packed_loss, alone_loss, std::sqrt(d2 / n2));
      EXPECT_LT(std::sqrt(d2 / n2), 1e-5) << what;
      expect_close(as_double(packed_grads), as_double(alone_grads), 1e-4, 2e-5 * gmax,
                   (what + ": packed gradients").c_str());
    }
}

// Instruction fine-tuning: two conversations packed in one record, their targets masked to the
// assistant tokens, against each conversation alone in a record padded to the sequence length
// (as data/sft_dataset.hpp lays records out): equal summed losses and gradients.
TEST(PackedGpt, SftPackedConversationsEqualOneByOne) {
  struct Conv {
    std::vector<std::int32_t> tokens;
    std::vector<std::uint8_t> learned;
  };
  const std::vector<Conv> convs = {{{1, 9, 4, 4, 11, 6, 2}, {0, 0, 0, 1, 1, 1, 1}},
                                   {{1, 9, 13, 7, 20}, {0, 0, 1, 1, 0}}};
  auto record = [](const std::vector<const Conv*>& in) {
    std::vector<std::int32_t> r(static_cast<size_t>(3 * kS), -1);
    std::int64_t at = 0, seg = 0;
    for (const Conv* c : in) {
      const std::int64_t n = static_cast<std::int64_t>(c->tokens.size());
      for (std::int64_t k = 0; k < n; ++k, ++at) {
        r[static_cast<size_t>(at)] = c->tokens[static_cast<size_t>(k)];
        r[static_cast<size_t>(kS + at)] = k + 1 < n && c->learned[static_cast<size_t>(k + 1)]
                                              ? c->tokens[static_cast<size_t>(k + 1)]
                                              : -1;
        r[static_cast<size_t>(2 * kS + at)] = static_cast<std::int32_t>(seg);
      }
      ++seg;
    }
    for (; at < kS; ++at) r[static_cast<size_t>(at)] = kEod;  // padding: targets and segment -1
    return r;
  };
  const std::vector<std::int32_t> packed = record({&convs[0], &convs[1]});
  std::vector<std::int32_t> alone = record({&convs[0]});
  const auto second = record({&convs[1]});
  alone.insert(alone.end(), second.begin(), second.end());
  for (const bool llama : {false, true})
    for (const bool flash : {false, true}) {
      const TransformerConfig cfg = packed_config(llama);
      const auto [packed_loss, packed_grads] = run_windows(cfg, packed, 1, flash, /*sft=*/true, 7);
      const auto [alone_loss, alone_grads] = run_windows(cfg, alone, 2, flash, /*sft=*/true, 7);
      const std::string what = std::string(llama ? "Llama" : "GPT-2") + (flash ? " flash" : " unfused");
      EXPECT_NEAR(packed_loss, alone_loss, 1e-5 * std::abs(packed_loss)) << what;
      double d2 = 0, n2 = 0;
      for (size_t i = 0; i < alone_grads.size(); ++i) {
        d2 += std::pow(static_cast<double>(packed_grads[i]) - alone_grads[i], 2);
        n2 += std::pow(static_cast<double>(alone_grads[i]), 2);
      }
      std::printf("SFT %s: packed vs one by one: loss %.9g vs %.9g, gradient relative L2 difference %.2e\n",
                  what.c_str(), packed_loss, alone_loss, std::sqrt(d2 / n2));
      EXPECT_LT(std::sqrt(d2 / n2), 1e-5) << what;
    }
}

// The key-value cache honours document bounds as training does: the logits after a prompt
// "A <eod> B" equal those after "B" alone, at prefill and at every cached decoding step (GPT-2's
// layer with learned positions and the Llama layer with rotary positions).
TEST(PackedGpt, KeyValueCacheStartsANewDocumentAfterEod) {
  for (const bool llama : {false, true}) {
    const TransformerConfig cfg = packed_config(llama);
    ParamStore store;
    GptModel model(cfg, store, 1);
    store.allocate();
    store.initialize(11);
    const std::vector<std::int32_t> a = {3, 7, 1, kEod}, b = {5, 20, 6};
    std::vector<std::int32_t> ab = a;
    ab.insert(ab.end(), b.begin(), b.end());
    GptGenerator packed(model, 1, kS, kEod), alone(model, 1, kS, kEod);
    auto lp = packed.prefill(0, ab), la = alone.prefill(0, b);
    const std::string what = llama ? "Llama" : "GPT-2";
    expect_close(as_double(lp), as_double(la), 1e-5, 1e-5, (what + " prefill").c_str());
    for (std::int32_t step = 0; step < 3; ++step) {
      const std::int32_t t = static_cast<std::int32_t>(9 + step);
      lp = packed.decode({t}, {static_cast<std::int64_t>(ab.size()) + step});
      la = alone.decode({t}, {static_cast<std::int64_t>(b.size()) + step});
      expect_close(as_double(lp), as_double(la), 1e-5, 1e-5, (what + " decode step " + std::to_string(step)).c_str());
    }
    // without the document settings the first document is seen: the logits differ
    TransformerConfig plain = cfg;
    plain.reset_position_ids = plain.reset_attention_mask = false;
    ParamStore store2;
    GptModel model2(plain, store2, 1);
    store2.allocate();
    store2.initialize(11);
    GptGenerator whole(model2, 1, kS, kEod);
    const auto lw = whole.prefill(0, ab);
    double diff = 0;
    for (size_t i = 0; i < lw.size(); ++i) diff = std::max(diff, std::abs(static_cast<double>(lw[i]) - la[i]));
    EXPECT_GT(diff, 1e-3) << what;
  }
}
