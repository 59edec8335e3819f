// Rotary position embedding (Su et al. 2021, "RoFormer"; Megatron's --position-embedding-type rope)
// in Hugging Face Llama's rotate-half convention: of a head's first `rot` channels (rot = head
// dim x rotary_percent, even), channel c < rot/2 pairs with c + rot/2 and at position p both turn
// by the angle p * f_c:  x'_c = x_c cos - x_{c+rot/2} sin,  x'_{c+rot/2} = x_{c+rot/2} cos + x_c sin,
// with f_c = base^(-2c / rot); the channels after rot pass unchanged. Llama 3.1's frequency
// scaling (Hugging Face's "llama3" rope_type) rescales the long wavelengths. The angles' cos and sin
// are computed in double on the host and kept as an fp32 table (positions, rot/2).
#pragma once
#include <vector>

#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

struct RopeFrequencies {
  std::int64_t rot = 0;  // rotated channels per head (even)
  double base = 10000.0;
  // Llama 3.1: factor, low / high frequency factors, the original context length
  bool scaling = false;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_positions = 8192.0;
};
// f_c for c in [0, rot/2), scaled when `scaling` (host, double).
std::vector<double> rope_inv_freq(const RopeFrequencies& f);

// The cos / sin table of positions [0, positions): (positions, rot/2) each, fp32 on the device.
struct RopeTable {
  FloatView cos, sin;
  std::int64_t positions = 0, half = 0;
};
RopeTable make_rope_table(const RopeFrequencies& f, std::int64_t positions);

// Where the rotated heads sit in each row of a (rows, width) buffer: nq query heads from column
// q0 and nk key heads from column k0, hs channels each; the row's position is positions(row), or
// row % T when positions is empty (B sequences of T rows).
struct RopeLayout {
  std::int64_t rows = 0, T = 0, width = 0, hs = 0;
  std::int64_t q0 = 0, nq = 0, k0 = 0, nk = 0;
};
// Rotates the query and key heads of x in place (fp32, or 16-bit words: rounded once after the
// turn).
void rope_forward(const Act& x, const RopeTable& t, const RopeLayout& l, const IntView& positions = {});
// The adjoint (the inverse turn) on a gradient, in place: dx of the rotated heads -> dx before them.
// dx fp32, or 16-bit words (the device path's gradient from cuDNN's attention: each pair widened
// exactly, turned in fp32 and rounded once, what a widen-turn-round sequence gives).
void rope_backward(const Act& dx, const RopeTable& t, const RopeLayout& l, const IntView& positions = {});

}  // namespace trident
