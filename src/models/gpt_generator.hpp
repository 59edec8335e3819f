// Autoregressive GPT inference (apps/generate_gpt): the trained parameters of a GptModel's
// ParamStore (fp32, any tensor-parallel size, pp = 1), run forward one chunk of tokens at a time
// with a key-value cache, as Megatron's inference path does:
//   prefill(slot, tokens)   the prompt of one sample from position 0: every layer's keys and values
//                           go into the slot's cache; returns the last position's logits
//   decode(tokens, pos)     one new token for each slot in use at its own position (batched), the
//                           attention reading the cached keys and values of the earlier positions
// Recomputing the prefix instead (prefill of the whole sequence at every step) is the uncached path.
// Tensor parallel like training: heads and MLP columns split over TP, the row-parallel outputs
// all-reduced, the vocabulary-parallel logits all-gathered so every rank samples the same token.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/param_store.hpp"
#include "layers/tensor_parallel.hpp"
#include "models/gpt_model.hpp"

namespace trident {

class GptGenerator {
 public:
  // cfg and store: a GPT (causal stack, no token types, no decoder) with fp32 parameters declared by GptModel
  // and loaded; slots: samples decoded together; max_len: positions per sample (<= max_positions).
  GptGenerator(const TransformerConfig& cfg, const ParamStore& store, const TensorParallel& tp, std::int64_t slots,
               std::int64_t max_len);
  // Logits (vocab_size) of the last of `tokens`, run from position 0 into slot `slot`'s cache.
  std::vector<float> prefill(std::int64_t slot, const std::vector<std::int32_t>& tokens);
  // tokens[b], at position pos[b] of slot b (b < tokens.size()), with slot b's cache holding its
  // positions [0, pos[b]); returns logits (tokens.size(), vocab_size), row-major.
  std::vector<float> decode(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& pos);
  std::int64_t max_len() const { return max_len_; }
  // The body of prefill and decode (public only because CUDA's device lambdas may not live in
  // private members): runs R = B * n rows (B samples of n new tokens each) through the model;
  // slot0: the slot of the first sample (the others follow); a causal prefill (n > 1, positions
  // 0..n-1) or one token per sample with `lengths` valid keys each (positions + 1).
  std::vector<float> forward(std::int64_t B, std::int64_t n, std::int64_t slot0, const std::vector<std::int32_t>& tok,
                             const std::vector<std::int32_t>& positions, const std::vector<std::int64_t>& lengths);

 private:
  struct Layer {
    FloatView ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    FloatView cache;  // (slots, max_len, 2 C_l): the k half then the v half of each position
  };
  FloatView param(const ParamStore& store, const std::string& name) const;

  TransformerConfig cfg_;
  TensorParallel tp_;
  std::int64_t slots_, max_len_, Cl_, Fl_, nhl_, Vl_, vstart_;
  std::vector<Layer> layers_;
  FloatView wte_, wpe_, lnf_w_, lnf_b_;
  // workspaces for up to max_len rows
  FloatView x_, h_, mean_, rstd_, qkv_, q_, att_, y_, out_, fc_, act_, logits_, gathered_;
  IntView tokens_, positions_, valid_;
};

}  // namespace trident
