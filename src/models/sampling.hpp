// Picking the next token from a row of logits (generate_gpt, serve_gpt): greedy, or
// softmax(logits / temperature) restricted to the top-k tokens and to the smallest set whose
// probabilities reach top-p, drawn with one uniform number from a caller's 64-bit key (so that a
// sample depends only on the key, not on the batch it was decoded in).
#pragma once
#include <cstdint>
#include <vector>

namespace trident {

struct SamplingParams {
  bool greedy = false;
  double temperature = 1.0;  // > 0 unless greedy
  double top_p = 1.0;        // (0, 1]
  std::int64_t top_k = 0;    // 0: every token
};

// The vocabulary in decreasing logit order, ties by increasing id, in O(V) (two 16-bit radix
// passes over an order-preserving key); -0.0 sorts as +0.0.
void order_by_logit(const float* logits, std::int64_t V, std::vector<std::int32_t>& ids);

// The next token among logits[0, V): the first maximum when greedy, else a draw keyed by `key`.
std::int32_t sample_token(const float* logits, std::int64_t V, const SamplingParams& p, std::uint64_t key);

// log softmax(logits)[id] over logits[0, V), in double from the fp32 logits (the model's own
// log-probability of a token, temperature 1).
double token_logprob(const float* logits, std::int64_t V, std::int32_t id);

}  // namespace trident
