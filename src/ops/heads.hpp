// Heads of a strided row buffer as contiguous rows, and back: the per-head modules (q/k
// normalisation, Qwen 3) run the normalisation slot's kernels over rows of hs channels, while
// the heads sit in the projection's rows. Of a (rows, width) buffer, the block of n channels
// from column c0 of each row (nh heads of hs channels: n = nh hs) is (rows nh, hs) contiguous
// rows of the packed buffer, in row-major order.
#pragma once
#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

// dst (rows, n) fp32 <- src(r, c0 + c) (fp32, or 16-bit words widened exactly)
void heads_gather(const FloatView& dst, const Act& src, std::int64_t rows, std::int64_t width, std::int64_t c0,
                  std::int64_t n);
// dst(r, c0 + c) <- src (rows, n); both of one storage type
void heads_scatter(const Act& dst, const Act& src, std::int64_t rows, std::int64_t width, std::int64_t c0,
                   std::int64_t n);

}  // namespace trident
