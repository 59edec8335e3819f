// The kernels of elementwise.hpp: one thread per element (common/host_parallel), except bias_backward (a thread
// per block of 64 columns walking the rows in order: deterministic, no atomics) and sum_squares
// (fixed chunks of 1024 values summed in fp32, the chunk sums in double), so neither result
// depends on the backend's thread count.
#include "ops/elementwise.hpp"

#include <math.h>

#include <algorithm>

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "common/simd.hpp"

namespace trident {

void add(const FloatView& out, const FloatView& a, const FloatView& b, std::int64_t n) {
  for_each_index(
      "ops::add", n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = a(i) + b(i); });
}

void accumulate(const FloatView& acc, const FloatView& x, std::int64_t n) {
  for_each_index(
      "ops::accumulate", n, KOKKOS_LAMBDA(std::int64_t i) { acc(i) += x(i); });
}

namespace {
template <class F, class V>
void add_bias_impl(const char* label, const FloatView& y, const V& bias, std::int64_t rows, std::int64_t cols) {
  for_each_element(
      label, rows, cols, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) { y(i) += F::load(bias(c)); });
}
}  // namespace

void add_bias(const FloatView& y, const Act& bias, std::int64_t rows, std::int64_t cols) {
  if (bias.dt == DType::F32)
    add_bias_impl<F32Fmt>("ops::add_bias", y, bias.f, rows, cols);
  else if (bias.dt == DType::BF16)
    add_bias_impl<Bf16Fmt>("ops::add_bias_half", y, bias.h, rows, cols);
  else
    add_bias_impl<Fp16Fmt>("ops::add_bias_half", y, bias.h, rows, cols);
}

void tanh_forward(const FloatView& out, const FloatView& x, std::int64_t n) {
  for_each_index(
      "ops::tanh_forward", n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = dtanh(x(i)); });
}

void tanh_backward(const FloatView& dx, const FloatView& dout, const FloatView& out, std::int64_t n) {
  for_each_index(
      "ops::tanh_backward", n, KOKKOS_LAMBDA(std::int64_t i) { dx(i) = dout(i) * (1.f - out(i) * out(i)); });
}

namespace {
template <class V>
void gather_rows_impl(const V& out, const V& x, std::int64_t n, std::int64_t stride, std::int64_t cols) {
  for_each_index(
      "ops::gather_strided_rows", n * cols,
      KOKKOS_LAMBDA(std::int64_t i) { out(i) = x((i / cols) * stride * cols + i % cols); });
}
}  // namespace

void gather_strided_rows(const Act& out, const Act& x, std::int64_t n, std::int64_t stride, std::int64_t cols) {
  if (x.is_half())
    gather_rows_impl(out.h, x.h, n, stride, cols);
  else
    gather_rows_impl(out.f, x.f, n, stride, cols);
}

void scatter_add_strided_rows(const FloatView& dx, const FloatView& dout, std::int64_t n, std::int64_t stride,
                              std::int64_t cols) {
  for_each_index(
      "ops::scatter_add_strided_rows", n * cols,
      KOKKOS_LAMBDA(std::int64_t i) { dx((i / cols) * stride * cols + i % cols) += dout(i); });
}

namespace {
// one block of columns [c0, c1) of bias_backward: contiguous row segments summed in order
TRIDENT_HOST_NOINLINE KOKKOS_FUNCTION void bias_backward_block(float* out, const float* d, std::int64_t rows,
                                                               std::int64_t cols, std::int64_t c0, std::int64_t c1) {
  constexpr std::int64_t kCols = 64;
  float acc[kCols] = {};  // (kCols): this block's column sums
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = d + r * cols;
    TRIDENT_SIMD
    for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
  }
  for (std::int64_t c = c0; c < c1; ++c) out[c] += acc[c - c0];
}
}  // namespace

void bias_backward(const FloatView& dbias, const FloatView& dy, std::int64_t rows, std::int64_t cols) {
  // One thread per block of kCols columns walks the rows, summing contiguous row segments
  // (vectorised, cache-friendly); deterministic, no atomics. The block is one compiled function
  // (as chunk_sum_squares, below: a vectorised loop inlined into the host threads' loop is slower).
  constexpr std::int64_t kCols = 64;
  const float* d = dy.data();
  float* out = dbias.data();
  if constexpr (kDeviceKernels) {  // a GPU: one thread per (part of the rows, column)
    column_sums<1>(
        "ops::bias_backward", rows, cols,
        KOKKOS_LAMBDA(std::int64_t r, std::int64_t c, float* acc) { acc[0] += d[r * cols + c]; }, ColumnOut<1>{{out}});
    return;
  }
  for_each_chunk(
      "ops::bias_backward", (cols + kCols - 1) / kCols, KOKKOS_LAMBDA(std::int64_t blk) {
        const std::int64_t c0 = blk * kCols, c1 = c0 + kCols < cols ? c0 + kCols : cols;
        bias_backward_block(out, d, rows, cols, c0, c1);
      });
}

void scale(const FloatView& x, float s, std::int64_t n) {
  for_each_index(
      "ops::scale", n, KOKKOS_LAMBDA(std::int64_t i) { x(i) *= s; });
}

namespace {
// the sum of squares of one chunk in fp32 (vectorised), the same compiled code for every caller
TRIDENT_HOST_NOINLINE KOKKOS_FUNCTION float chunk_sum_squares(const float* p, std::int64_t len) {
  float s = 0.f;
  TRIDENT_SIMD_SUM(s)
  for (std::int64_t i = 0; i < len; ++i) s += p[i] * p[i];
  return s;
}
// RangeSquares' values per thread (as sum_squares' device chunks)
constexpr std::int64_t kSquareChunk = 32;
}  // namespace

double sum_squares(const FloatView& x, std::int64_t n) {
  // Chunks of kChunk values are summed in fp32 (vectorised; relative error ~kChunk * 6e-8 at
  // worst, far below what clipping needs), chunk sums accumulated in double in chunk order
  // (common/host_parallel's sum_chunks). The chunking is fixed, so under a Serial host Kokkos the
  // result does not depend on the thread count.
  // On a device, chunks of 32 (more threads; another order of additions than the host's).
  constexpr std::int64_t kChunk = kDeviceKernels ? 32 : 1024;
  const float* data = x.data();
  TRIDENT_DEVICE_READ();
  return sum_chunks(
      "ops::sum_squares", (n + kChunk - 1) / kChunk, KOKKOS_LAMBDA(std::int64_t c) {
        const std::int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
        return static_cast<double>(chunk_sum_squares(data + b, e - b));
      });
}

RangeSquares::RangeSquares(std::vector<Range> ranges, int classes) : classes_(classes) {
  std::stable_sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.cls < b.cls; });
  const std::int64_t R = static_cast<std::int64_t>(ranges.size());
  HostView1<std::int64_t> b("range_begin", static_cast<size_t>(R)), e("range_end", static_cast<size_t>(R)),
      c("range_chunk", static_cast<size_t>(R));
  class_chunk_.assign(static_cast<size_t>(classes) + 1, 0);
  std::int64_t at = 0;
  int cls = 0;
  for (std::int64_t r = 0; r < R; ++r) {
    const Range& g = ranges[static_cast<size_t>(r)];
    TRIDENT_REQUIRE(g.cls >= 0 && g.cls < classes && g.end >= g.begin, "internal: RangeSquares range " << r);
    while (cls < g.cls) class_chunk_[static_cast<size_t>(++cls)] = at;
    b(r) = g.begin;
    e(r) = g.end;
    c(r) = at;
    at += (g.end - g.begin + kSquareChunk - 1) / kSquareChunk;
  }
  while (cls < classes) class_chunk_[static_cast<size_t>(++cls)] = at;
  chunks_ = at;
  range_begin_ = Kokkos::create_mirror_view_and_copy(MemSpace(), b);
  range_end_ = Kokkos::create_mirror_view_and_copy(MemSpace(), e);
  range_chunk_ = Kokkos::create_mirror_view_and_copy(MemSpace(), c);
  part_ = View1<double>("range_squares::part", static_cast<size_t>(std::max<std::int64_t>(chunks_, 1)));
  sums_ = View1<double>("range_squares::sums", static_cast<size_t>(classes));
}

std::vector<double> RangeSquares::run(const FloatView& x) const {
  const float* data = x.data();
  const auto rb = range_begin_, re = range_end_, rc = range_chunk_;
  const auto part = part_;
  const std::int64_t R = static_cast<std::int64_t>(rb.extent(0));
  Kokkos::parallel_for(
      "ops::range_squares", range(chunks_), KOKKOS_LAMBDA(std::int64_t c) {
        std::int64_t lo = 0, hi = R - 1;  // the last range whose first chunk is <= c
        while (lo < hi) {
          const std::int64_t mid = (lo + hi + 1) / 2;
          if (rc(mid) <= c)
            lo = mid;
          else
            hi = mid - 1;
        }
        const std::int64_t b = rb(lo) + (c - rc(lo)) * kSquareChunk;
        const std::int64_t e = b + kSquareChunk < re(lo) ? b + kSquareChunk : re(lo);
        part(c) = static_cast<double>(chunk_sum_squares(data + b, e - b));
      });
  for (int k = 0; k < classes_; ++k) {
    const std::int64_t c0 = class_chunk_[static_cast<size_t>(k)], c1 = class_chunk_[static_cast<size_t>(k) + 1];
    Kokkos::parallel_reduce(
        "ops::range_squares_sum", Kokkos::RangePolicy<ExecSpace>(c0, c1),
        KOKKOS_LAMBDA(std::int64_t c, double& acc) { acc += part(c); }, Kokkos::subview(sums_, k));
  }
  TRIDENT_DEVICE_READ();
  const auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), sums_);
  return std::vector<double>(h.data(), h.data() + classes_);
}

bool has_nonfinite(const FloatView& x, std::int64_t n) {
  // a count of NaN or inf values per chunk (v - v is NaN for both), exact in any order
  constexpr std::int64_t kChunk = kDeviceKernels ? 32 : 4096;
  const float* data = x.data();
  TRIDENT_DEVICE_READ();
  const double bad = sum_chunks(
      "ops::has_nonfinite", (n + kChunk - 1) / kChunk, KOKKOS_LAMBDA(std::int64_t c) {
        const std::int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
        int count = 0;
        for (std::int64_t i = b; i < e; ++i) count += !(data[i] - data[i] == 0.f);
        return static_cast<double>(count);
      });
  return bad != 0;
}

}  // namespace trident
