// Embedding kernels (docs/DESIGN.md "Tensor and sequence parallelism"): the vocabulary-parallel
// word-embedding lookup (a rank reads only its rows [start, start + rows_local) of the padded
// table and writes 0 for other tokens; the partial rows are then summed over TP), learned
// absolute positions added to the rows held here, and their backward passes into fp32 gradients.
// The tables are Acts: fp32, or bf16 / fp16 words (one kernel template, chosen once per call).
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// out (N, C) = wte[tok - start] for tokens in [start, start + rows_local), else 0
// (vocabulary-parallel lookup; the partial results are summed over TP afterwards).
void embedding_lookup(const FloatView& out, const IntView& tokens, const Act& wte, std::int64_t start,
                      std::int64_t rows_local, std::int64_t N, std::int64_t C);
// dwte[tok - start] += dout[n] for tokens of this rank's range, each table row's contributions
// added in row order (deterministic, the same bits on every backend). order: the N rows sorted by
// token, ties by row (MicroBatch::token_order); the device kernels use it to give each (token,
// channel) its own thread, and without it walk all the rows per channel; host kernels ignore it.
void embedding_lookup_backward(const FloatView& dwte, const FloatView& dout, const IntView& tokens, std::int64_t start,
                               std::int64_t rows_local, std::int64_t N, std::int64_t C, const IntView& order = {});
// x (R, C) += wpe[p(row0 + i)] for local rows i (row0: first global row held here), where
// p(row) = row % T, or positions(row) when positions (B * T, global rows) is given (packed
// sequences: each document's positions start at 0).
void add_positions(const FloatView& x, const Act& wpe, std::int64_t row0, std::int64_t R, std::int64_t T,
                   std::int64_t C, const IntView& positions = {});
// dwpe[p(row0 + i)] += dx[i], each position's rows in order (deterministic, the same bits on every
// backend). order: with positions given, their global rows sorted by position, ties by row
// (MicroBatch::position_order), used by the device kernels as embedding_lookup_backward's.
void add_positions_backward(const FloatView& dwpe, const FloatView& dx, std::int64_t row0, std::int64_t R,
                            std::int64_t T, std::int64_t C, const IntView& positions = {}, const IntView& order = {});

// Single-rank convenience: out (B*T, C) = wte[tokens] + wpe[t]; and its backward.
void embedding_forward(const FloatView& out, const IntView& tokens, const FloatView& wte, const FloatView& wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C);
void embedding_backward(const FloatView& dwte, const FloatView& dwpe, const FloatView& dout, const IntView& tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C);

}  // namespace trident
