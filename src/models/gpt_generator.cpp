// GptGenerator (gpt_generator.hpp): a key-value cache per layer and workspaces; forward() runs
// R = B * n rows through the model's own pieces in fp32 (no dropout, no backward): the
// vocabulary-parallel embedding all-reduced over TP plus the positions, every layer's
// TransformerLayer::infer (the new keys and values stored in the cache, the queries attending
// over it), then the final LayerNorm of each sample's last row and the logits against the tied
// word embeddings, gathered over TP to (B, vocab_size).
#include "models/gpt_generator.hpp"

#include <algorithm>
#include <string>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "ops/attention.hpp"
#include "ops/elementwise.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"

namespace trident {

GptGenerator::GptGenerator(const GptModel& model, std::int64_t slots, std::int64_t max_len, std::int32_t eod)
    : model_(&model), cfg_(model.config()), slots_(slots), max_len_(max_len), documents_(cfg_.packed()), eod_(eod) {
  const TransformerConfig& cfg = cfg_;
  TRIDENT_REQUIRE(cfg.layer.mask == MaskKind::Causal && cfg.num_token_types == 0 && !cfg.encoder_decoder(),
                  "generation runs GPT models (a causal stack without token types or decoder)");
  TRIDENT_REQUIRE(model.params().dtype() == DType::F32, "generation: the parameters must be fp32");
  TRIDENT_REQUIRE(model.stage().pre && model.stage().post && model.num_layers() == cfg.num_layers,
                  "generation: the model must hold every layer (pipeline size 1)");
  TRIDENT_REQUIRE(max_len >= 1 && max_len <= cfg.max_positions,
                  "generation: " << max_len << " positions exceed the model's " << cfg.max_positions);
  const std::int64_t p = model.tensor_parallel().size(), C = cfg.hidden_size;
  Ql_ = cfg.q_width() / p;
  KVl_ = cfg.kv_width() / p;  // the cache holds the key/value groups only
  nhl_ = cfg.num_heads / p;
  ngl_ = cfg.groups() / p;
  Vl_ = model.vocab_local();
  for (std::int64_t l = 0; l < cfg.num_layers; ++l)
    caches_.push_back(make_float("generate::kv_cache", slots * max_len * 2 * KVl_));
  const std::int64_t R = std::max(max_len, slots);  // rows of one call: a prompt or one token per slot
  x_ = make_float("generate::x", R * C);
  w_.h = make_float("generate::h", R * C);
  w_.mean = make_float("generate::mean", R);
  w_.rstd = make_float("generate::rstd", R);
  w_.qkv = make_float("generate::qkv", R * (Ql_ + 2 * KVl_));
  w_.q = make_float("generate::q", R * Ql_);
  w_.att = make_float("generate::att", std::max(max_len * max_len, slots * max_len) * nhl_);
  w_.y = make_float("generate::y", R * Ql_);
  if (cfg.qk_layernorm) {
    const std::int64_t heads = (cfg.num_heads + cfg.groups()) / p;
    w_.qk_x = make_float("generate::qk_x", R * heads * cfg.head_dim());
    w_.qk_out = make_float("generate::qk_out", R * heads * cfg.head_dim());
    w_.qk_mean = make_float("generate::qk_mean", R * heads);
    w_.qk_rstd = make_float("generate::qk_rstd", R * heads);
  }
  w_.out = make_float("generate::out", R * C);
  w_.fc = make_float("generate::fc", mlp_infer_floats(cfg, p, R));
  w_.act = make_float("generate::act", mlp_infer_floats(cfg, p, R));
  logits_ = make_float("generate::logits", slots * Vl_);
  gathered_ = make_float("generate::gathered", slots * Vl_ * p);
  tokens_ = make_int("generate::tokens", R);
  positions_ = make_int("generate::positions", R);
  valid_ = make_int("generate::valid", slots * max_len);
  if (documents_) {
    TRIDENT_REQUIRE(eod >= 0,
                    "generation: data.reset_position_ids / reset_attention_mask need the tokenizer's "
                    "end-of-document token, and it has none");
    enc_positions_ = make_int("generate::enc_positions", R);
    doc_start_ = make_int("generate::doc_start", R);
    slot_doc_.assign(static_cast<size_t>(slots), 0);
  }
}

std::int64_t GptGenerator::cache_bytes() const {
  std::int64_t n = 0;
  for (const FloatView& c : caches_)
    n += static_cast<std::int64_t>(c.span()) * static_cast<std::int64_t>(sizeof(float));
  return n;
}

std::vector<float> GptGenerator::prefill(std::int64_t slot, const std::vector<std::int32_t>& tokens) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  TRIDENT_REQUIRE(n >= 1, "generation: an empty prompt");
  TRIDENT_REQUIRE(n <= max_len_,
                  "generation: the prompt has " << n << " tokens, more than the context of " << max_len_);
  TRIDENT_REQUIRE(slot >= 0 && slot < slots_, "internal: generation slot " << slot);
  std::vector<std::int32_t> pos(static_cast<size_t>(n));  // (n): positions 0..n-1
  for (std::int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  if (!documents_) return forward(1, n, slot, tokens, pos, {n});
  // packed documents, as training stages them (train/family_task.cpp): the end-of-document token
  // closes its document
  std::vector<std::int32_t> enc(pos.size()), doc(pos.size());
  std::int64_t d = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    enc[static_cast<size_t>(i)] = static_cast<std::int32_t>(cfg_.reset_position_ids ? i - d : i);
    doc[static_cast<size_t>(i)] = static_cast<std::int32_t>(cfg_.reset_attention_mask ? d : 0);
    if (tokens[static_cast<size_t>(i)] == eod_) d = i + 1;
  }
  slot_doc_[static_cast<size_t>(slot)] = d;
  return forward(1, n, slot, tokens, pos, {n}, enc, doc);
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
  if (!documents_) return forward(B, 1, 0, tokens, p32, lengths);
  std::vector<std::int32_t> enc(tokens.size()), doc(tokens.size());
  for (size_t b = 0; b < tokens.size(); ++b) {
    const std::int64_t d = std::min(slot_doc_[b], pos[b]);  // a slot that rides along at its last position
    enc[b] = static_cast<std::int32_t>(cfg_.reset_position_ids ? pos[b] - d : pos[b]);
    doc[b] = static_cast<std::int32_t>(cfg_.reset_attention_mask ? d : 0);
    if (tokens[b] == eod_) slot_doc_[b] = pos[b] + 1;
  }
  return forward(B, 1, 0, tokens, p32, lengths, enc, doc);
}

std::vector<float> GptGenerator::forward(std::int64_t B, std::int64_t n, std::int64_t slot0,
                                         const std::vector<std::int32_t>& tok,
                                         const std::vector<std::int32_t>& positions,
                                         const std::vector<std::int64_t>& lengths,
                                         const std::vector<std::int32_t>& enc_positions,
                                         const std::vector<std::int32_t>& doc_start) {
  const std::int64_t C = cfg_.hidden_size, R = B * n, L = max_len_;
  const std::int64_t Tk = *std::max_element(lengths.begin(), lengths.end());
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
    if (!enc_positions.empty()) {  // mirrors of their own (on the host a mirror is the view itself)
      auto he = Kokkos::create_mirror_view(enc_positions_);
      auto hd = Kokkos::create_mirror_view(doc_start_);
      for (std::int64_t r = 0; r < R; ++r) {
        he(r) = enc_positions[static_cast<size_t>(r)];
        hd(r) = doc_start[static_cast<size_t>(r)];
      }
      Kokkos::deep_copy(enc_positions_, he);
      Kokkos::deep_copy(doc_start_, hd);
    }
    auto hv = Kokkos::create_mirror_view(valid_);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < Tk; ++j) hv(b * Tk + j) = j < lengths[static_cast<size_t>(b)] ? 1 : 0;
    Kokkos::deep_copy(valid_, hv);
  }
  // embeddings: vocabulary-parallel word rows summed over TP, plus the positions' rows
  const ParamStore& store = model_->params();
  const TensorParallel& tp = model_->tensor_parallel();
  const FloatView x = x_, h = w_.h, out = w_.out;  // (R, C)
  embedding_lookup(x, tokens_, store.value(model_->word_embeddings()), model_->vocab_start(), Vl_, R, C);
  TRIDENT_DEVICE_WAIT();
  tp_allreduce(tp, x, R * C);
  const IntView enc = enc_positions.empty() ? IntView() : slice(enc_positions_, 0, R);
  if (cfg_.learned_positions()) {  // rotary positions turn the queries and keys in each layer instead
    embedding_lookup(out, enc_positions.empty() ? positions_ : enc, store.value(model_->position_embeddings()), 0,
                     cfg_.max_positions, R, C);
    TRIDENT_DEVICE_WAIT();
    accumulate(x, out, R * C);
  }
  AttentionShape as{B, n, Ql_, nhl_};
  as.ng = ngl_;
  as.Tk = n > 1 ? n : Tk;
  as.kv_stride = L;
  const AttentionMask mask{n > 1, n > 1 ? IntView() : slice(valid_, 0, B * Tk),
                           doc_start.empty() ? IntView() : slice(doc_start_, 0, R)};
  for (std::int64_t l = 0; l < model_->num_layers(); ++l) {
    const FloatView cache = slice(caches_[static_cast<size_t>(l)], slot0 * L * 2 * KVl_,
                                  (slots_ - slot0) * L * 2 * KVl_);  // from slot0 on
    model_->layer(l).infer(x, cache, positions_, R, n, L, as, mask, w_, enc);
  }
  // the last row of each sample: final LayerNorm, then this rank's vocabulary columns
  Kokkos::parallel_for(
      "generate::last_rows", range(B * C), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t b = i / C, c = i % C;
        out(i) = x((b * n + n - 1) * C + c);
      });
  TRIDENT_DEVICE_WAIT();
  model_->final_norm().forward(h, w_.mean, w_.rstd, out, B);
  TRIDENT_DEVICE_WAIT();
  gemm(Trans::N, Trans::T, B, Vl_, C, 1.f, h.data(), C, store.value(model_->output_weights()).data(), C, 0.f,
       logits_.data(), Vl_);
  TRIDENT_DEVICE_WAIT();
  const std::int64_t p = tp.size(), V = cfg_.vocab_size;
  FloatView all = logits_;  // (B, V_l), or (p, B, V_l) once gathered
  if (p > 1) {
    tp.comm->allgather(logits_.data(), gathered_.data(), B * Vl_);  // (p, B, V_l)
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
