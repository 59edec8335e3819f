// GptGenerator (gpt_generator.hpp): views of this rank's fp32 parameter slices by checkpoint
// name, workspaces and a key-value cache per layer; forward() runs R = B * n rows with plain fp32
// ops (no dropout, no backward): the vocabulary-parallel embedding all-reduced over TP plus the
// positions, per layer LayerNorm, the qkv GEMM with the new keys and values stored in the cache,
// attention of the queries over the cache, proj and the MLP all-reduced over TP; then the final
// LayerNorm of each sample's last row and the logits, gathered over TP to (B, vocab_size).
#include "models/gpt_generator.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "ops/attention.hpp"
#include "ops/elementwise.hpp"
#include "ops/embedding.hpp"
#include "ops/gelu.hpp"
#include "ops/gemm.hpp"
#include "ops/layernorm.hpp"

namespace trident {

FloatView GptGenerator::param(const ParamStore& store, const std::string& name) const {
  const ParamId id = store.find(name);
  TRIDENT_REQUIRE(id >= 0, "generation: the model has no parameter '" << name << "'");
  return store.value(id);
}

GptGenerator::GptGenerator(const TransformerConfig& cfg, const ParamStore& store, const TensorParallel& tp,
                           std::int64_t slots, std::int64_t max_len)
    : cfg_(cfg), tp_(tp), slots_(slots), max_len_(max_len) {
  TRIDENT_REQUIRE(cfg.layer.mask == MaskKind::Causal && cfg.num_token_types == 0 && !cfg.encoder_decoder(),
                  "generation runs GPT models (a causal stack without token types or decoder)");
  TRIDENT_REQUIRE(store.dtype() == DType::F32, "generation: the parameters must be fp32");
  TRIDENT_REQUIRE(max_len >= 1 && max_len <= cfg.max_positions,
                  "generation: " << max_len << " positions exceed the model's " << cfg.max_positions);
  const std::int64_t p = tp.size(), C = cfg.hidden;
  Cl_ = C / p;
  Fl_ = cfg.ffn / p;
  nhl_ = cfg.heads / p;
  Vl_ = cfg.padded_vocab / p;
  vstart_ = tp.rank() * Vl_;
  wte_ = param(store, "model/embedding/word_embeddings");
  wpe_ = param(store, "model/embedding/position_embeddings");
  lnf_w_ = param(store, "model/final_layernorm/weight");
  lnf_b_ = param(store, "model/final_layernorm/bias");
  for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string pre = layer_param_prefix(cfg, l) + "/";
    Layer L;
    L.ln1_w = param(store, pre + "input_layernorm/weight");
    L.ln1_b = param(store, pre + "input_layernorm/bias");
    L.qkv_w = param(store, pre + "self_attention/qkv/weight");  // (3 C_l, C): q | k | v blocks of my heads
    L.qkv_b = param(store, pre + "self_attention/qkv/bias");
    L.proj_w = param(store, pre + "self_attention/proj/weight");  // (C, C_l)
    L.proj_b = param(store, pre + "self_attention/proj/bias");
    L.ln2_w = param(store, pre + "post_attention_layernorm/weight");
    L.ln2_b = param(store, pre + "post_attention_layernorm/bias");
    L.fc1_w = param(store, pre + "mlp/fc1/weight");  // (F_l, C)
    L.fc1_b = param(store, pre + "mlp/fc1/bias");
    L.fc2_w = param(store, pre + "mlp/fc2/weight");  // (C, F_l)
    L.fc2_b = param(store, pre + "mlp/fc2/bias");
    L.cache = make_float("generate::kv_cache", slots * max_len * 2 * Cl_);
    layers_.push_back(L);
  }
  const std::int64_t R = std::max(max_len, slots);  // rows of one call: a prompt or one token per slot
  x_ = make_float("generate::x", R * C);
  h_ = make_float("generate::h", R * C);
  mean_ = make_float("generate::mean", R);
  rstd_ = make_float("generate::rstd", R);
  qkv_ = make_float("generate::qkv", R * 3 * Cl_);
  q_ = make_float("generate::q", R * Cl_);
  att_ = make_float("generate::att", std::max(max_len * max_len, slots * max_len) * nhl_);
  y_ = make_float("generate::y", R * Cl_);
  out_ = make_float("generate::out", R * C);
  fc_ = make_float("generate::fc", R * Fl_);
  act_ = make_float("generate::act", R * Fl_);
  logits_ = make_float("generate::logits", slots * Vl_);
  gathered_ = make_float("generate::gathered", slots * Vl_ * p);
  tokens_ = make_int("generate::tokens", R);
  positions_ = make_int("generate::positions", R);
  valid_ = make_int("generate::valid", slots * max_len);
}

std::vector<float> GptGenerator::prefill(std::int64_t slot, const std::vector<std::int32_t>& tokens) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  TRIDENT_REQUIRE(n >= 1, "generation: an empty prompt");
  TRIDENT_REQUIRE(n <= max_len_,
                  "generation: the prompt has " << n << " tokens, more than the context of " << max_len_);
  TRIDENT_REQUIRE(slot >= 0 && slot < slots_, "internal: generation slot " << slot);
  std::vector<std::int32_t> pos(static_cast<size_t>(n));  // (n): positions 0..n-1
  for (std::int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  return forward(1, n, slot, tokens, pos, {n});
}

std::vector<float> GptGenerator::decode(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& pos) {
  const auto B = static_cast<std::int64_t>(tokens.size());
  TRIDENT_REQUIRE(B >= 1 && B <= slots_ && pos.size() == tokens.size(), "internal: generation decode of " << B);
  std::vector<std::int32_t> p32(tokens.size());      // (B)
  std::vector<std::int64_t> lengths(tokens.size());  // (B): valid keys per sample
  for (size_t b = 0; b < tokens.size(); ++b) {
    TRIDENT_REQUIRE(pos[b] < max_len_, "generation: position " << pos[b] << " is beyond the context of " << max_len_);
    p32[b] = static_cast<std::int32_t>(pos[b]);
    lengths[b] = pos[b] + 1;
  }
  return forward(B, 1, 0, tokens, p32, lengths);
}

std::vector<float> GptGenerator::forward(std::int64_t B, std::int64_t n, std::int64_t slot0,
                                         const std::vector<std::int32_t>& tok,
                                         const std::vector<std::int32_t>& positions,
                                         const std::vector<std::int64_t>& lengths) {
  const std::int64_t C = cfg_.hidden, R = B * n, Cl = Cl_, Fl = Fl_, L = max_len_;
  const std::int64_t Tk = *std::max_element(lengths.begin(), lengths.end());
  const float eps = cfg_.ln_eps;
  for (std::int32_t t : tok)
    TRIDENT_REQUIRE(t >= 0 && t < cfg_.vocab_size, "generation: token id " << t << " is outside the vocabulary");
  {
    auto ht = Kokkos::create_mirror_view(tokens_);
    auto hp = Kokkos::create_mirror_view(positions_);
    for (std::int64_t r = 0; r < R; ++r) {
      ht(r) = tok[static_cast<size_t>(r)];
      hp(r) = positions[static_cast<size_t>(r)];
    }
    Kokkos::deep_copy(tokens_, ht);
    Kokkos::deep_copy(positions_, hp);
    auto hv = Kokkos::create_mirror_view(valid_);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < Tk; ++j) hv(b * Tk + j) = j < lengths[static_cast<size_t>(b)] ? 1 : 0;
    Kokkos::deep_copy(valid_, hv);
  }
  // embeddings: vocabulary-parallel word rows summed over TP, plus the positions' rows
  embedding_lookup(x_, tokens_, wte_, vstart_, Vl_, R, C);
  Kokkos::fence();
  tp_allreduce(tp_, x_, R * C);
  embedding_lookup(out_, positions_, wpe_, 0, cfg_.max_positions, R, C);
  Kokkos::fence();
  accumulate(x_, out_, R * C);
  AttentionShape as{B, n, Cl, nhl_};
  as.Tk = n > 1 ? n : Tk;
  as.kv_stride = L;
  const AttentionMask mask{n > 1, n > 1 ? IntView() : slice(valid_, 0, B * Tk)};
  // (R, C) x, h, out; (R, 3 C_l) qkv; (R, C_l) q, y; (R, F_l) fc, act
  const FloatView x = x_, h = h_, qkv = qkv_, q = q_, y = y_, out = out_, fc = fc_, act = act_;
  for (Layer& ly : layers_) {
    layernorm_forward(h, mean_, rstd_, x, ly.ln1_w, ly.ln1_b, R, C, eps);
    Kokkos::fence();
    gemm(Trans::N, Trans::T, R, 3 * Cl, C, 1.f, h.data(), C, ly.qkv_w.data(), C, 0.f, qkv.data(), 3 * Cl);
    add_bias(qkv, ly.qkv_b, R, 3 * Cl);
    Kokkos::fence();
    // the new rows' keys and values into the cache (row r: sample r / n at its position), the queries apart
    const FloatView cache = slice(ly.cache, slot0 * L * 2 * Cl, (slots_ - slot0) * L * 2 * Cl);  // from slot0 on
    const IntView pos = positions_;                                                              // (R)
    Kokkos::parallel_for(
        "generate::cache_store", range(R * Cl), KOKKOS_LAMBDA(std::int64_t i) {
          const std::int64_t r = i / Cl, c = i % Cl, b = r / n, at = (b * L + pos(r)) * 2 * Cl;
          q(r * Cl + c) = qkv(r * 3 * Cl + c);
          cache(at + c) = qkv(r * 3 * Cl + Cl + c);
          cache(at + Cl + c) = qkv(r * 3 * Cl + 2 * Cl + c);
        });
    Kokkos::fence();
    cross_attention_probs(att_, FloatView(), q, cache, as, {}, mask);
    cross_attention_context(y, att_, cache, as);
    Kokkos::fence();
    gemm(Trans::N, Trans::T, R, C, Cl, 1.f, y.data(), Cl, ly.proj_w.data(), Cl, 0.f, out.data(), C);
    Kokkos::fence();
    tp_allreduce(tp_, out, R * C);
    add_bias(out, ly.proj_b, R, C);
    accumulate(x, out, R * C);
    layernorm_forward(h, mean_, rstd_, x, ly.ln2_w, ly.ln2_b, R, C, eps);
    Kokkos::fence();
    gemm(Trans::N, Trans::T, R, Fl, C, 1.f, h.data(), C, ly.fc1_w.data(), C, 0.f, fc.data(), Fl);
    add_bias(fc, ly.fc1_b, R, Fl);
    gelu_forward(act, fc, R * Fl);
    Kokkos::fence();
    gemm(Trans::N, Trans::T, R, C, Fl, 1.f, act.data(), Fl, ly.fc2_w.data(), Fl, 0.f, out.data(), C);
    Kokkos::fence();
    tp_allreduce(tp_, out, R * C);
    add_bias(out, ly.fc2_b, R, C);
    accumulate(x, out, R * C);
    Kokkos::fence();
  }
  // the last row of each sample: final LayerNorm, then this rank's vocabulary columns
  Kokkos::parallel_for(
      "generate::last_rows", range(B * C), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t b = i / C, c = i % C;
        out(i) = x((b * n + n - 1) * C + c);
      });
  Kokkos::fence();
  layernorm_forward(h, mean_, rstd_, out, lnf_w_, lnf_b_, B, C, eps);
  Kokkos::fence();
  gemm(Trans::N, Trans::T, B, Vl_, C, 1.f, h.data(), C, wte_.data(), C, 0.f, logits_.data(), Vl_);
  Kokkos::fence();
  const std::int64_t p = tp_.size(), V = cfg_.vocab_size;
  FloatView all = logits_;  // (B, V_l), or (p, B, V_l) once gathered
  if (p > 1) {
    tp_.comm->allgather(logits_.data(), gathered_.data(), B * Vl_);  // (p, B, V_l)
    all = gathered_;
  }
  auto host = Kokkos::create_mirror_view(all);
  Kokkos::deep_copy(host, all);
  std::vector<float> result(static_cast<size_t>(B * V));  // (B, vocab_size)
  for (std::int64_t r = 0; r < p; ++r)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < Vl_ && r * Vl_ + j < V; ++j)
        result[static_cast<size_t>(b * V + r * Vl_ + j)] = host((r * B + b) * Vl_ + j);
  return result;
}

}  // namespace trident
