// GPT embeddings: word (token) plus learned absolute position embeddings.
#pragma once
#include "common/types.hpp"

namespace trident {

// out (B*T, C) = wte[tokens[b,t]] + wpe[t]
void embedding_forward(const FloatView& out, const IntView& tokens, const FloatView& wte, const FloatView& wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C);
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t]
void embedding_backward(const FloatView& dwte, const FloatView& dwpe, const FloatView& dout, const IntView& tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C);

}  // namespace trident
