// The device layouts of common/device_parallel.hpp, run on whatever execution space the build has
// (the host's Serial Kokkos here, the GPU in the CUDA build of scripts/gpu_check.sh):
// column_sums adds each column in its documented order (parts of rows_per_part rows, then the parts
// in order: bitwise against that order evaluated here in float) and agrees with double sums;
// for_each_row's warps give every row's sum, maximum (the empty row's the -3e38 sentinel) and first
// value, and its 16-byte groups the same values as word-by-word access; device_scratch keeps what it gave
// until a larger request.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "ops/fused.hpp"
#include "ops/mixed_precision.hpp"
#include "test_helpers.hpp"

namespace trident {
namespace {

using test::random_vector;
using test::to_device;
using test::to_host;

// out[k][c] += sum_n term_k(n, c) with term_0 = a, term_1 = a - b, through column_sums<2>. (No
// product: nvcc contracts a product and a sum into one fused multiply-add, which the order check
// below, evaluated on the host, would not reproduce; measured on the H200.)
void two_column_sums(const FloatView& a, const FloatView& b, std::int64_t rows, std::int64_t cols,
                     const FloatView& out0, const FloatView& out1) {
  const float *ad = a.data(), *bd = b.data();
  column_sums<2>(
      "test::column_sums", rows, cols,
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t c, float* acc) {
        acc[0] += ad[n * cols + c];
        acc[1] += ad[n * cols + c] - bd[n * cols + c];
      },
      ColumnOut<2>{{out0.data(), out1.data()}});
  Kokkos::fence();
}

TEST(DeviceParallel, ColumnSumsAddInTheirDocumentedOrder) {
  // rows below, at and above one part (32 rows), and enough rows for parts of more than 32
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 3}, {31, 5}, {32, 64}, {33, 7}, {1000, 100}, {9001, 3}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    const auto a = random_vector(static_cast<size_t>(rows * cols), 11 + rows);
    const auto b = random_vector(static_cast<size_t>(rows * cols), 23 + cols);
    const std::vector<float> init0 = random_vector(static_cast<size_t>(cols), 5),
                             init1 = random_vector(static_cast<size_t>(cols), 6);
    FloatView out0 = to_device(init0), out1 = to_device(init1);
    two_column_sums(to_device(a), to_device(b), rows, cols, out0, out1);
    const auto got0 = to_host(out0), got1 = to_host(out1);
    const std::int64_t per = rows_per_part(rows);
    EXPECT_GE(per, 32);
    EXPECT_LE((rows + per - 1) / per, 256);
    for (std::int64_t c = 0; c < cols; ++c) {
      // the documented order in float: each part in row order, then the parts in order
      float total0 = 0.f, total1 = 0.f;
      double exact0 = init0[c], exact1 = init1[c];
      for (std::int64_t p0 = 0; p0 < rows; p0 += per) {
        float s0 = 0.f, s1 = 0.f;
        for (std::int64_t n = p0; n < std::min(rows, p0 + per); ++n) {
          const float x = a[n * cols + c], y = b[n * cols + c];
          s0 += x;
          s1 += x - y;
          exact0 += x;
          exact1 += static_cast<double>(x) - y;
        }
        total0 += s0;
        total1 += s1;
      }
      const float want0 = init0[c] + total0, want1 = init1[c] + total1;
      EXPECT_EQ(std::memcmp(&got0[c], &want0, 4), 0) << "column " << c << ": " << got0[c] << " vs " << want0;
      EXPECT_EQ(std::memcmp(&got1[c], &want1, 4), 0) << "column " << c << ": " << got1[c] << " vs " << want1;
      EXPECT_NEAR(got0[c], exact0, 1e-5 * (1 + std::sqrt(static_cast<double>(rows))));
      EXPECT_NEAR(got1[c], exact1, 1e-5 * (1 + std::sqrt(static_cast<double>(rows))));
    }
  }
}

// rows_with_column_sums<1> with row(n) adding n + 1 to each of its cells of `seen` and the column
// sums of `in` added into out (a function of its own: nvcc takes no device lambda in a test body)
void rows_and_sums(const FloatView& in, const FloatView& seen, const FloatView& out, std::int64_t rows,
                   std::int64_t cols) {
  const float* ad = in.data();
  rows_with_column_sums<1>(
      "test::rows_with_column_sums", rows, cols,
      KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
        row_for_groups(t, cols, [&](std::int64_t c0, int cnt) {
          for (int k = 0; k < cnt; ++k) seen(n * cols + c0 + k) += static_cast<float>(n + 1);
        });
      },
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t c, float* acc) { acc[0] += ad[n * cols + c]; },
      ColumnOut<1>{{out.data()}});
  Kokkos::fence();
}

// rows_with_column_sums: every row's row() ran once (it writes the row's index into its own cells)
// and the sums are added in the documented order: each part of kRowsPerPart rows in row order, the
// parts in order, added to what the outputs held.
TEST(DeviceParallel, RowsWithColumnSumsRunEveryRowAndAddInTheirDocumentedOrder) {
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 3}, {15, 5}, {16, 64}, {17, 7}, {1000, 130}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    const auto a = random_vector(static_cast<size_t>(rows * cols), 31 + rows);
    const std::vector<float> init = random_vector(static_cast<size_t>(cols), 7);
    FloatView seen = make_float("seen", rows * cols), out = to_device(init);
    rows_and_sums(to_device(a), seen, out, rows, cols);
    const auto got = to_host(out), rows_seen = to_host(seen);
    for (std::int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(rows_seen[i], static_cast<float>(i / cols + 1)) << i;
    for (std::int64_t c = 0; c < cols; ++c) {
      float total = 0.f;
      for (std::int64_t p0 = 0; p0 < rows; p0 += kRowsPerPart) {
        float part = 0.f;
        for (std::int64_t n = p0; n < std::min(rows, p0 + kRowsPerPart); ++n) part += a[n * cols + c];
        total += part;
      }
      const float want = init[c] + total;
      EXPECT_EQ(std::memcmp(&got[c], &want, 4), 0) << "column " << c << ": " << got[c] << " vs " << want;
    }
  }
}

TEST(DeviceParallel, ColumnSumsOfNoRowsChangeNothing) {
  FloatView a = to_device(std::vector<float>(4, 1.f)), out0 = to_device(std::vector<float>{1, 2}),
            out1 = to_device(std::vector<float>{3, 4});
  two_column_sums(a, a, 0, 2, out0, out1);
  EXPECT_EQ(to_host(out0), (std::vector<float>{1, 2}));
  EXPECT_EQ(to_host(out1), (std::vector<float>{3, 4}));
}

// Through for_each_row's warps and 16-byte groups (F the words' format): out, a copy of the rows of
// x by load_group and store_group; each row's sum and maximum by row_sum_values and row_max_values;
// and its first value as row_share gives it to every lane (0 for an empty row)
template <class F, class T>
void group_rows(const T* x, T* out, std::int64_t rows, std::int64_t cols, bool packed, const FloatView& sums,
                const FloatView& maxima, const FloatView& firsts) {
  for_each_row(
      "test::group_rows", rows, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t r) {
        const T* xr = x + r * cols;
        T* orow = out + r * cols;
        const float s = row_sum_values<F>(t, cols, xr, packed, [](float v) { return v; });
        const float m = row_max_values<F>(t, cols, xr, packed, [](float v) { return v; });
        const float first = cols > 0 ? row_share(t, [&]() { return F::load(xr[0]); }) : 0.f;
        row_for_groups(t, cols, [&](std::int64_t c0, int cnt) {
          float v[kGroup];
          load_group<F>(xr + c0, cnt, packed, v);
          store_group<F>(orow + c0, cnt, packed, v);
        });
        row_once(t, [&]() {
          sums(r) = s;
          maxima(r) = m;
          firsts(r) = first;
        });
      });
  Kokkos::fence();
}

// The rows through for_each_row's warps (9 rows: not a whole number of teams; lengths around a
// group's 8 and a warp's 32 lanes, long ones, and empty rows), by 16-byte packs (aligned arrays, rows
// a whole number of groups) or word by word (the same arrays one word off their alignment): the same
// copy, bitwise, and the same sums and maxima, bitwise, the sums near the exact ones and the
// maxima exact (-3e38 for an empty row); for fp32 and bf16 words.
template <class F, class T>
void check_groups(DType dt) {
  for (const std::int64_t cols : {0, 1, 7, 8, 9, 31, 32, 33, 64, 100, 768, 4096, 5000}) {
    SCOPED_TRACE(testing::Message() << dtype_name(dt) << " cols " << cols);
    const std::int64_t rows = 9, n = rows * cols;
    const auto xf = random_vector(static_cast<size_t>(n), 11 + cols);
    std::vector<T> xw(static_cast<size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) xw[i] = F::store(xf[i]);
    std::vector<float> got_sum[2], got_max[2];
    for (const int offset : {0, 1}) {
      View1<T> x("test::x", n + 8), out("test::out", n + 8);
      auto xh = Kokkos::create_mirror_view(x);
      for (std::int64_t i = 0; i < n; ++i) xh(offset + i) = xw[i];
      Kokkos::deep_copy(x, xh);
      const T* xp = x.data() + offset;
      T* op = out.data() + offset;
      const bool packed = rows_packed(cols, xp, op);
      EXPECT_EQ(packed, offset == 0 && cols % kGroup == 0);
      FloatView sums = make_float("test::sums", rows), maxima = make_float("test::max", rows),
                firsts = make_float("test::first", rows);
      group_rows<F>(xp, op, rows, cols, packed, sums, maxima, firsts);
      auto oh = Kokkos::create_mirror_view(out);
      Kokkos::deep_copy(oh, out);
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(std::memcmp(&oh(offset + i), &xw[i], sizeof(T)), 0) << i;
      got_sum[offset] = to_host(sums);
      got_max[offset] = to_host(maxima);
      const auto first = to_host(firsts);
      for (std::int64_t r = 0; r < rows && cols > 0; ++r) ASSERT_EQ(first[r], F::load(xw[r * cols])) << r;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      double exact = 0;
      float mx = -3.0e38f;
      for (std::int64_t j = 0; j < cols; ++j) {
        exact += F::load(xw[r * cols + j]);
        mx = std::max(mx, F::load(xw[r * cols + j]));
      }
      EXPECT_EQ(std::memcmp(&got_sum[0][r], &got_sum[1][r], 4), 0) << got_sum[0][r] << " vs " << got_sum[1][r];
      EXPECT_NEAR(got_sum[0][r], exact, 1e-5 * (1 + std::sqrt(static_cast<double>(cols))));
      EXPECT_EQ(got_max[0][r], mx);
      EXPECT_EQ(got_max[1][r], mx);
    }
  }
}

TEST(DeviceParallel, RowWarpsGiveTheSameValuesPackedOrWordByWord) {
  check_groups<F32Fmt, float>(DType::F32);
  check_groups<Bf16Fmt, std::uint16_t>(DType::BF16);
}

TEST(DeviceParallel, ScratchGrowsAndKeepsItsSizeForSmallerRequests) {
  const FloatView a = device_scratch(1000);
  EXPECT_GE(static_cast<std::int64_t>(a.extent(0)), 1000);
  const FloatView b = device_scratch(10);
  EXPECT_EQ(a.data(), b.data());
  const FloatView c = device_scratch(100000);
  EXPECT_GE(static_cast<std::int64_t>(c.extent(0)), 100000);
}

}  // namespace
}  // namespace trident

// The vectorised element-wise kernels (for_each_vector: 16-byte packs where every buffer is
// aligned, element by element otherwise and for the tail) give each element's own bits whatever
// the alignment and the length: pack_half, unpack_half and bias_dropout_add on views that start
// 0 to 7 elements into their buffers, with lengths that are and are not whole groups.
namespace trident {
TEST(DeviceParallel, VectorisedKernelsGiveEachElementsBitsAtAnyAlignment) {
  using namespace test;
  const auto src = random_vector(80, 31), res = random_vector(80, 32), bias = random_vector(3, 33);
  for (const DType dt : {DType::BF16, DType::F16})
    for (std::int64_t off = 0; off < 8; ++off)
      for (const std::int64_t n : {0, 5, 8, 36, 64}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " offset " << off << " n " << n);
        const FloatView in = to_device(src);
        HalfView h = make_half("h", 80);
        pack_half(dt, slice(h, off, n), slice(in, off, n), n);
        const auto w = Kokkos::create_mirror_view_and_copy(HostSpace(), h);
        for (std::int64_t i = 0; i < 80; ++i) ASSERT_EQ(w(i), i >= off && i < off + n ? round16(dt, src[i]) : 0) << i;
        FloatView back = make_float("back", 80);
        unpack_half(dt, slice(back, off, n), slice(h, off, n), n);
        const auto b = to_host(back);
        for (std::int64_t i = 0; i < 80; ++i)
          ASSERT_EQ(b[i], i >= off && i < off + n ? widen16(dt, round16(dt, src[i])) : 0.f) << i;
      }
  // bias + dropout + residual, 3 columns (a group spans rows), against one element at a time
  for (std::int64_t off = 0; off < 4; ++off)
    for (const float p : {0.f, 0.3f}) {
      const std::int64_t rows = 11, cols = 3, n = rows * cols;
      DropoutSpec d;
      d.p = p;
      d.key = 77;
      FloatView out = make_float("out", 80);
      bias_dropout_add(slice(out, off, n), slice(to_device(res), off, n), slice(to_device(src), off, n),
                       act(to_device(bias)), rows, cols, d);
      const auto o = to_host(out);
      const float scale = p > 0.f ? 1.f / (1.f - p) : 1.f;
      for (std::int64_t i = 0; i < n; ++i) {
        // the documented rounding (test_fused's BiasDropoutAddGivesTheBitsOfItsFormula)
        volatile float v = src[off + i] + bias[i % cols];
        volatile float scaled = v * scale;
        volatile float sum = p > 0.f ? scaled + res[off + i] : res[off + i] + v;
        float want = sum;
        if (p > 0.f && dropout_uniform(d.key, static_cast<std::uint64_t>(i)) < p)
          want = res[off + i] + 0.f;
        else if (p > 0.f && dfma_fuses())
          want = std::fma(static_cast<float>(v), scale, res[off + i]);
        ASSERT_EQ(std::memcmp(&o[off + i], &want, 4), 0) << "offset " << off << " p " << p << " element " << i;
      }
    }
}
}  // namespace trident
