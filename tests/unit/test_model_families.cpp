// Model-level checks of the BERT and T5 families (models/bert_model, models/t5_model), as
// test_model.cpp has for GPT: parameter gradients against finite differences of the loss the
// family reports, what the padding mask promises (padded positions change nothing), the loss
// independent of vocabulary padding, T5's decoder causal (a decoder input changes no earlier
// target's loss), the named loss parts adding up to the loss, and forward equal to the loss of
// forward_backward. Tiny shapes, one rank, fp32, no dropout.
#include <cmath>

#include "models/bert_model.hpp"
#include "models/t5_model.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {

constexpr std::int64_t kB = 2, kS = 6, kSd = 5, kV = 37, kC = 16;

TransformerConfig base(std::int64_t padded) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = kC;
  c.num_heads = 2;
  c.ffn_hidden_size = 32;
  c.seq_length = kS;
  c.max_positions = 8;
  c.vocab_size = kV;
  c.padded_vocab = padded;
  c.init_method_std = 0.3f;  // larger than 0.02 so that every path carries gradient signal
  return c;
}

TransformerConfig bert_config(std::int64_t padded = 64) {
  TransformerConfig c = base(padded);
  BertModel::set_spec(c);
  return c;
}

TransformerConfig t5_config(std::int64_t padded = 64) {
  TransformerConfig c = base(padded);
  T5Model::set_spec(c, 2, kSd);
  return c;
}

std::vector<std::int32_t> ids(std::int64_t n, std::int64_t below, std::uint64_t seed) {
  CounterRng r(seed);
  std::vector<std::int32_t> t(static_cast<size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<std::int32_t>(r.below_at(i, below));
  return t;
}

// Positions that carry a label (>= 0).
std::int64_t count_labelled(const std::vector<std::int32_t>& labels) {
  std::int64_t n = 0;
  for (auto v : labels) n += v >= 0;
  return n;
}

// Host vectors into the micro-batch's device views.
void copy_fields(std::initializer_list<std::pair<IntView, const std::vector<std::int32_t>*>> fields) {
  for (const auto& [view, host] : fields) Kokkos::deep_copy(view, to_device(*host));
}

// A BERT micro-batch held on the host: sample 0 is full, sample 1 has its last two positions
// padded; a few positions carry masked-LM labels; both samples carry a sentence-order label.
struct BertBatch {
  std::vector<std::int32_t> tokens = ids(kB * kS, kV, 1), types = std::vector<std::int32_t>(kB * kS, 0),
                            labels = std::vector<std::int32_t>(kB * kS, -1),
                            padding = std::vector<std::int32_t>(kB * kS, 1), order = {0, 1};
  BertBatch() {
    for (std::int64_t t = 3; t < kS; ++t) types[t] = types[kS + t] = 1;
    padding[kS + kS - 1] = padding[kS + kS - 2] = 0;
    const auto l = ids(kB * kS, kV, 2);
    for (std::int64_t i : {std::int64_t{1}, std::int64_t{4}, std::int64_t{5}, kS + 0, kS + 2}) labels[i] = l[i];
  }
  std::int64_t labelled() const { return count_labelled(labels); }
  void load(MicroBatch& mb) const {
    copy_fields({{mb.tokens, &tokens},
                 {mb.types, &types},
                 {mb.targets, &labels},
                 {mb.padding, &padding},
                 {mb.sentence_order, &order}});
    mb.num_targets = labelled();
    mb.num_sentences = kB;
  }
};

// A T5 micro-batch: encoder tokens with sample 1's last position padded, decoder inputs and
// targets (sample 1's last decoder target unlabelled).
struct T5Batch {
  std::vector<std::int32_t> enc = ids(kB * kS, kV, 3), padding = std::vector<std::int32_t>(kB * kS, 1),
                            dec = ids(kB * kSd, kV, 4), targets = ids(kB * kSd, kV, 5);
  T5Batch() {
    padding[kS + kS - 1] = 0;
    targets[kSd + kSd - 1] = -1;
  }
  std::int64_t labelled() const { return count_labelled(targets); }
  void load(MicroBatch& mb) const {
    copy_fields({{mb.tokens, &enc}, {mb.padding, &padding}, {mb.dec_tokens, &dec}, {mb.targets, &targets}});
    mb.num_targets = labelled();
  }
};

// A freshly initialised model of one family with one micro-batch loaded.
template <class Model>
struct Loaded {
  template <class Batch>
  Loaded(const TransformerConfig& cfg, const Batch& batch, std::uint64_t seed) : model(cfg, store, kB) {
    store.allocate();
    store.initialize(seed);
    mb = model.allocate_micro_batch();
    batch.load(mb);
    store.zero_grads();
  }
  ParamStore store;
  Model model;
  MicroBatch mb;
};

template <class Model, class Batch>
void check_gradients(const TransformerConfig& cfg, const Batch& batch, std::uint64_t seed) {
  Loaded<Model> m(cfg, batch, seed);
  m.model.forward_backward(m.mb, 1.f);  // the gradient of the family's loss (a mean) itself
  auto grads = to_host(m.store.grads());
  auto values = to_host(m.store.values());
  auto loss = [&] {
    Kokkos::deep_copy(m.store.values(),
                      Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()));
    return m.model.forward(m.mb);
  };
  for (const auto& p : m.store.params()) {
    std::vector<size_t> idx;
    const std::int64_t rows_valid = p.valid[0] * (p.shape.size() > 1 ? p.shape[1] : 1);
    for (auto i : sample_indices(static_cast<size_t>(rows_valid), 10, std::hash<std::string>()(p.name)))
      idx.push_back(static_cast<size_t>(p.offset) + i);
    auto num = numeric_gradient(values, loss, idx, 1e-2f);
    std::vector<double> ana;
    for (auto i : idx) ana.push_back(grads[i]);
    expect_close(ana, num, 2e-2, 5e-4, p.name.c_str());
  }
}

// The loss and the whole gradient of one micro-batch, from a freshly initialised model.
template <class Model, class Batch>
std::pair<double, std::vector<float>> loss_and_grads(const TransformerConfig& cfg, const Batch& batch,
                                                     std::uint64_t seed, LossParts* parts = nullptr) {
  Loaded<Model> m(cfg, batch, seed);
  const double loss = m.model.forward_backward(m.mb, 1.f);
  if (parts) *parts = m.model.take_loss_parts();
  return {loss, to_host(m.store.grads())};
}

// The loss of forward (no gradient) of one micro-batch, from a freshly initialised model.
template <class Model, class Batch>
double forward_loss(const TransformerConfig& cfg, const Batch& batch, std::uint64_t seed) {
  Loaded<Model> m(cfg, batch, seed);
  return m.model.forward(m.mb);
}

}  // namespace

TEST(BertModel, GradientsMatchFiniteDifferencesOfTheLoss) { check_gradients<BertModel>(bert_config(), BertBatch(), 7); }

TEST(BertModel, PaddedPositionsChangeNothing) {
  BertBatch a, b;
  for (std::int64_t t = 0; t < kS; ++t)
    if (!b.padding[kS + t]) b.tokens[kS + t] = (b.tokens[kS + t] + 11) % kV, b.types[kS + t] = 1 - b.types[kS + t];
  ASSERT_NE(a.tokens, b.tokens);
  const auto la = loss_and_grads<BertModel>(bert_config(), a, 13), lb = loss_and_grads<BertModel>(bert_config(), b, 13);
  EXPECT_EQ(la.first, lb.first);
  // Padded positions reach no loss term and, masked as keys, no other position: every gradient
  // is the same, bit for bit (their embedding rows receive exact zeros).
  ASSERT_EQ(la.second.size(), lb.second.size());
  for (size_t i = 0; i < la.second.size(); ++i) ASSERT_EQ(la.second[i], lb.second[i]) << i;
  // and the same change at a real position does change the loss
  BertBatch c;
  c.tokens[kS + 1] = (c.tokens[kS + 1] + 11) % kV;
  EXPECT_NE(loss_and_grads<BertModel>(bert_config(), c, 13).first, la.first);
}

TEST(BertModel, LossDoesNotDependOnVocabularyPadding) {
  const BertBatch batch;
  const auto a = loss_and_grads<BertModel>(bert_config(37), batch, 11);
  const auto b = loss_and_grads<BertModel>(bert_config(128), batch, 11);
  EXPECT_NEAR(a.first, b.first, 1e-5 * std::fabs(a.first));
}

TEST(BertModel, LossPartsAddUpAndForwardEqualsForwardBackward) {
  const BertBatch batch;
  LossParts parts;
  const auto fb = loss_and_grads<BertModel>(bert_config(), batch, 5, &parts);
  EXPECT_NEAR(parts.lm + parts.sop, fb.first, 1e-12 * std::fabs(fb.first));
  EXPECT_GT(parts.lm, 0.0);
  EXPECT_GT(parts.sop, 0.0);
  EXPECT_EQ(parts.lm_count, static_cast<double>(batch.labelled()));
  EXPECT_EQ(parts.sop_count, static_cast<double>(kB));
  EXPECT_NEAR(parts.lm_sum / parts.lm_count, parts.lm, 1e-12 * parts.lm);
  EXPECT_EQ(forward_loss<BertModel>(bert_config(), batch, 5), fb.first);
}

TEST(BertModel, WithoutTheBinaryHeadTheLossIsTheMaskedLmLoss) {
  const BertBatch batch;
  ParamStore store;
  BertModel model(bert_config(), store, kB, {}, {}, /*binary_head=*/false);
  store.allocate();
  store.initialize(5);
  MicroBatch mb = model.allocate_micro_batch();
  batch.load(mb);
  const double loss = model.forward(mb);
  const LossParts parts = model.take_loss_parts();
  EXPECT_EQ(parts.sop, 0.0);
  EXPECT_NEAR(parts.lm, loss, 1e-12 * loss);
  EXPECT_EQ(store.find("model/binary_head/weight"), -1);
}

TEST(T5Model, GradientsMatchFiniteDifferencesOfTheLoss) { check_gradients<T5Model>(t5_config(), T5Batch(), 9); }

TEST(T5Model, DecoderIsCausal) {
  // Only targets at positions < 2 count; decoder inputs at positions >= 2 change nothing.
  T5Batch a;
  for (std::int64_t j = 0; j < kB; ++j)
    for (std::int64_t t = 2; t < kSd; ++t) a.targets[j * kSd + t] = -1;
  T5Batch b = a;
  for (std::int64_t j = 0; j < kB; ++j)
    for (std::int64_t t = 2; t < kSd; ++t) b.dec[j * kSd + t] = (b.dec[j * kSd + t] + 7) % kV;
  const auto la = loss_and_grads<T5Model>(t5_config(), a, 17), lb = loss_and_grads<T5Model>(t5_config(), b, 17);
  EXPECT_EQ(la.first, lb.first);
  // and the inputs before do change it
  T5Batch c = a;
  c.dec[1] = (c.dec[1] + 7) % kV;
  EXPECT_NE(loss_and_grads<T5Model>(t5_config(), c, 17).first, la.first);
}

TEST(T5Model, PaddedEncoderPositionsChangeNothing) {
  T5Batch a, b;
  b.enc[kS + kS - 1] = (b.enc[kS + kS - 1] + 5) % kV;
  const auto la = loss_and_grads<T5Model>(t5_config(), a, 19), lb = loss_and_grads<T5Model>(t5_config(), b, 19);
  EXPECT_EQ(la.first, lb.first);
  // and a real encoder position does change it
  T5Batch c;
  c.enc[kS + 1] = (c.enc[kS + 1] + 5) % kV;
  EXPECT_NE(loss_and_grads<T5Model>(t5_config(), c, 19).first, la.first);
}

TEST(T5Model, LossIsTheMeanOverDecoderTargetsAndIndependentOfVocabularyPadding) {
  const T5Batch batch;
  LossParts parts;
  const auto a = loss_and_grads<T5Model>(t5_config(37), batch, 23, &parts);
  const auto b = loss_and_grads<T5Model>(t5_config(128), batch, 23);
  EXPECT_NEAR(a.first, b.first, 1e-5 * std::fabs(a.first));
  EXPECT_EQ(parts.lm_count, static_cast<double>(batch.labelled()));
  EXPECT_NEAR(parts.lm, a.first, 1e-12 * a.first);
  EXPECT_NEAR(parts.lm_sum / parts.lm_count, a.first, 1e-12 * a.first);
  EXPECT_EQ(parts.sop, 0.0);
  EXPECT_EQ(forward_loss<T5Model>(t5_config(37), batch, 23), a.first);
}

TEST(T5Model, ParametersRecordTheirGlobalLayer) {
  // A pipeline stage holding only decoder layers (global 2 and 3 of 2 encoder + 2 decoder layers):
  // each parameter records the global layer that declared it, which the overlapped gradient
  // reduction buckets by; embeddings, final LayerNorms and the head record none.
  const TransformerConfig cfg = t5_config();
  ParamStore store;
  ModelStage stage;
  stage.first_layer = 2;
  stage.num_layers = 2;
  stage.pre = false;
  T5Model model(cfg, store, kB, {}, stage);
  int in_layers = 0;
  for (const auto& p : store.params()) {
    const bool dec0 = p.name.rfind("model/decoder/layers/0/", 0) == 0,
               dec1 = p.name.rfind("model/decoder/layers/1/", 0) == 0;
    EXPECT_EQ(p.layer, dec0 ? 2 : dec1 ? 3 : -1) << p.name;
    in_layers += dec0 || dec1;
  }
  EXPECT_GT(in_layers, 0);
  EXPECT_EQ(layer_param_prefix(cfg, 1), "model/encoder/layers/1");
  EXPECT_EQ(layer_param_prefix(cfg, 3), "model/decoder/layers/1");
  EXPECT_EQ(layer_param_prefix(base(64), 3), "model/layers/3");
}
