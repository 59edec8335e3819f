// Autoregressive GPT inference (apps/generate_gpt): a GptModel's own layers (fp32 parameters, any
// tensor-parallel size, pp = 1) run forward one chunk of tokens at a time with a key-value cache,
// as Megatron's inference path does:
//   prefill(slot, tokens)   the prompt of one sample from position 0: every layer's keys and values
//                           go into the slot's cache; returns the last position's logits
//   decode(tokens, pos)     one new token for each slot in use at its own position (batched), the
//                           attention reading the cached keys and values of the earlier positions
// Recomputing the prefix instead (prefill of the whole sequence at every step) is the uncached path.
// The generator owns only the caches and workspaces: embeddings, layers (TransformerLayer::infer),
// final LayerNorm and the tied output embedding are the model's. Tensor parallel like training:
// heads and MLP columns split over TP, the row-parallel outputs all-reduced, the
// vocabulary-parallel logits all-gathered so every rank samples the same token.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/transformer_layer.hpp"
#include "models/gpt_model.hpp"

namespace trident {

class GptGenerator {
 public:
  // model: a GPT (causal stack, no token types, no decoder, one pipeline stage) with fp32
  // parameters, loaded; it must outlive the generator. slots: samples decoded together; max_len:
  // positions per sample (<= max_positions).
  // eod: the end-of-document id; with the model's packed-document settings (data.reset_position_ids,
  // reset_attention_mask) a token after an end-of-document token starts a new document, in a
  // prompt and while decoding alike: its position restarts at 0 and it attends to nothing before.
  GptGenerator(const GptModel& model, std::int64_t slots, std::int64_t max_len, std::int32_t eod = -1);
  // Logits (vocab_size) of the last of `tokens`, run from position 0 into slot `slot`'s cache.
  std::vector<float> prefill(std::int64_t slot, const std::vector<std::int32_t>& tokens);
  // tokens[b], at position pos[b] of slot b (b < tokens.size()), with slot b's cache holding its
  // positions [0, pos[b]); returns logits (tokens.size(), vocab_size), row-major.
  std::vector<float> decode(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& pos);
  std::int64_t max_len() const { return max_len_; }
  // Bytes of this rank's key-value caches as allocated (every layer; the key/value groups only)
  std::int64_t cache_bytes() const;
  // The body of prefill and decode (public only because CUDA's device lambdas may not live in
  // private members): runs R = B * n rows (B samples of n new tokens each) through the model;
  // slot0: the slot of the first sample (the others follow); a causal prefill (n > 1, positions
  // 0..n-1) or one token per sample with `lengths` valid keys each (positions + 1).
  // Packed documents: enc_positions (R) the positions the embeddings use, doc_start (R) each row's
  // first key (empty: the cache rows `positions`, and no document bound).
  std::vector<float> forward(std::int64_t B, std::int64_t n, std::int64_t slot0, const std::vector<std::int32_t>& tok,
                             const std::vector<std::int32_t>& positions, const std::vector<std::int64_t>& lengths,
                             const std::vector<std::int32_t>& enc_positions = {},
                             const std::vector<std::int32_t>& doc_start = {});

 private:
  const GptModel* model_;
  TransformerConfig cfg_;
  std::int64_t slots_, max_len_, Ql_, KVl_, nhl_, ngl_, Vl_;
  std::vector<FloatView> caches_;  // per layer (slots, max_len, 2 C_l): the k half then the v half of each position
  TransformerLayer::InferenceScratch w_;  // workspaces for up to max(max_len, slots) rows
  FloatView x_, logits_, gathered_;       // (R, C) residual stream, (slots, V_l), (tp, slots, V_l)
  IntView tokens_, positions_, valid_;    // (R), (R), (slots, max_len)
  // packed documents: the end-of-document id, rows' embedding positions and first keys (R), and
  // each slot's current document start (its first cache row)
  bool documents_ = false;
  std::int32_t eod_ = -1;
  IntView enc_positions_, doc_start_;
  std::vector<std::int64_t> slot_doc_;
};

}  // namespace trident
