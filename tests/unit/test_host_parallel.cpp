// common/host_parallel.hpp (docs/DESIGN.md "Host threads"): every index, element and chunk runs
// exactly once whatever the thread count, and the results (sums included) are bitwise those of
// one thread. This file is compiled as the library's threaded folders are (TRIDENT_HOST_OPENMP
// when OpenMP is on), so under Debian's Serial Kokkos the threaded path is the one tested.
#if defined(_OPENMP) && !defined(TRIDENT_ENABLE_CUDA)
#define TRIDENT_HOST_OPENMP 1
#include <omp.h>
#endif
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/host_parallel.hpp"
#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "ops/layernorm.hpp"
#include "ops/rmsnorm.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {
const int kThreads[] = {1, 2, 3, 5};

std::vector<std::int32_t> counts(const IntView& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<std::int32_t>(h.data(), h.data() + h.extent(0));
}

std::uint64_t bits(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The kernels under test live in free functions, not in the TEST bodies: nvcc refuses an extended
// __host__ __device__ lambda (KOKKOS_LAMBDA in a CUDA build) whose enclosing function is private
// in its class, as GoogleTest's TestBody is.
void count_each_index(const IntView& seen, std::int64_t n) {
  for_each_index(
      "test::index", n, KOKKOS_LAMBDA(std::int64_t i) { seen(i) += 1; });
}

void record_each_column(const IntView& col, const IntView& hits, std::int64_t rows, std::int64_t cols) {
  for_each_element(
      "test::element", rows, cols, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
        col(i) = static_cast<std::int32_t>(c);
        hits(i) += 1;
      });
}

double sum_of_parts(const Kokkos::View<double*, Kokkos::LayoutRight, ExecSpace::memory_space>& part,
                    std::int64_t chunks) {
  return sum_chunks(
      "test::sum", chunks, KOKKOS_LAMBDA(std::int64_t c) { return part(c); });
}
}  // namespace

TEST(HostParallel, EveryIndexRunsOnce) {
  for (std::int64_t n : {0, 1, 7, 4097, 100003})
    for (int t : kThreads) {
      IntView seen = make_int("seen", n > 0 ? n : 1);
      at_threads(t, [&] { count_each_index(seen, n); });
      Kokkos::fence();
      const auto c = counts(seen);
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(c[static_cast<size_t>(i)], 1) << "n " << n << " threads " << t;
    }
}

TEST(HostParallel, EveryElementGetsItsColumn) {
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 5}, {257, 33}, {2, 3072}})
    for (int t : kThreads) {
      IntView col = make_int("col", rows * cols), hits = make_int("hits", rows * cols);
      at_threads(t, [&] { record_each_column(col, hits, rows, cols); });
      Kokkos::fence();
      const auto cs = counts(col), hs = counts(hits);
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_EQ(hs[static_cast<size_t>(i)], 1) << rows << "x" << cols << " threads " << t;
        ASSERT_EQ(cs[static_cast<size_t>(i)], i % cols) << rows << "x" << cols << " threads " << t;
      }
    }
}

TEST(HostParallel, ChunkSumsAddInChunkOrderAtAnyThreadCount) {
  if (!std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace> || ExecSpace::concurrency() > 1)
    GTEST_SKIP() << "a threaded or device Kokkos adds the chunk partials in its own order";
  // 1e16 first, then ones: in order every one is lost to rounding (the spacing of doubles at 1e16
  // is 2); a thread block summed apart would keep its ones and change the result
  const std::int64_t chunks = 1001;
  Kokkos::View<double*, Kokkos::LayoutRight, ExecSpace::memory_space> part("part", chunks);
  auto h = Kokkos::create_mirror_view(part);
  double ordered = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    h(c) = c == 0 ? 1e16 : 1.0;
    ordered += h(c);
  }
  Kokkos::deep_copy(part, h);
  for (int t : kThreads) {
    double got = 0;
    at_threads(t, [&] { got = sum_of_parts(part, chunks); });
    EXPECT_EQ(bits(got), bits(ordered)) << "threads " << t << ": " << got << " vs " << ordered;
    EXPECT_EQ(got, 1e16);
  }
}

TEST(HostParallel, SumOfSquaresIsBitwiseTheSameAtAnyThreadCount) {
  if (!std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace> || ExecSpace::concurrency() > 1)
    GTEST_SKIP() << "a threaded or device Kokkos adds the chunk partials in its own order";
  // the gradient norm's kernel (ops/elementwise), as the library compiles it: 3 M values
  const auto x = random_vector(3'000'017, 11, 3.f);
  const FloatView d = to_device(x);
  double one = 0;
  at_threads(1, [&] { one = sum_squares(d, static_cast<std::int64_t>(x.size())); });
  double ref = 0;  // fp32 chunks of 1024 in any lane order stay within 1e-5 of the double sum
  for (float v : x) ref += static_cast<double>(v) * v;
  EXPECT_NEAR(one, ref, 1e-5 * ref);
  for (int t : kThreads) {
    double got = 0;
    at_threads(t, [&] { got = sum_squares(d, static_cast<std::int64_t>(x.size())); });
    EXPECT_EQ(bits(got), bits(one)) << "threads " << t;
  }
}

TEST(HostParallel, BatchedGemmIsBitwiseTheSameAtAnyThreadCount) {
  // ops/gemm's strided batch (attention's per-head products): shared out whole over the threads
  // on the host; each product as one thread computes it, and equal to the naive product
  const std::int64_t M = 64, N = 64, K = 64, batch = 7;
  const auto a = random_vector(static_cast<size_t>(M * K * batch), 21),
             b = random_vector(static_cast<size_t>(K * N * batch), 22);
  const FloatView dA = to_device(a), dB = to_device(b);
  auto product = [&](int t) {
    FloatView dC = make_float("C", M * N * batch);
    at_threads(t, [&] {
      gemm_strided_batched(Trans::N, Trans::T, M, N, K, 1.f, dA.data(), K, M * K, dB.data(), K, K * N, 0.f, dC.data(),
                           N, M * N, batch);
    });
    Kokkos::fence();
    return to_host(dC);
  };
  const auto one = product(1);
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < M; i += 9)
      for (std::int64_t j = 0; j < N; j += 7) {
        double ref = 0;
        for (std::int64_t k = 0; k < K; ++k)
          ref += static_cast<double>(a[static_cast<size_t>(p * M * K + i * K + k)]) *
                 b[static_cast<size_t>(p * K * N + j * K + k)];
        ASSERT_NEAR(one[static_cast<size_t>(p * M * N + i * N + j)], ref, 1e-4) << p << " " << i << " " << j;
      }
  for (int t : kThreads) {
    const auto got = product(t);
    ASSERT_EQ(std::memcmp(got.data(), one.data(), got.size() * sizeof(float)), 0) << "threads " << t;
  }
}

namespace {
// The outputs of LayerNorm's or RMSNorm's forward and backward (backward adding into a dx that
// starts at dx0) over the rows [r0, r0 + n) of x and dout, as the library computes them.
struct NormRun {
  std::vector<float> out, stat, dx, dw, db;
};

// v as an Act of type dt (16-bit: rounded), and an Act's values as floats
Act act_of(DType dt, std::vector<float> v) { return dt == DType::F32 ? Act(to_device(v)) : to_half(dt, v); }

std::vector<float> floats_of(const Act& a) {
  if (a.dt == DType::F32) return to_host(a.f);
  std::vector<float> v;
  for (std::uint16_t h : words(a)) v.push_back(widen16(a.dt, h));
  return v;
}

std::vector<float> rows_of(const std::vector<float>& v, std::int64_t r0, std::int64_t n, std::int64_t C) {
  return std::vector<float>(v.begin() + r0 * C, v.begin() + (r0 + n) * C);
}

NormRun run_norm(bool rms, DType dt, const std::vector<float>& x, const std::vector<float>& dout,
                 const std::vector<float>& dx0, const std::vector<float>& w, const std::vector<float>& b,
                 std::int64_t r0, std::int64_t n, std::int64_t C) {
  const FloatView dx_ = to_device(rows_of(x, r0, n, C)), dd = to_device(rows_of(dout, r0, n, C)),
                  gx = to_device(rows_of(dx0, r0, n, C));
  const Act wa = act_of(dt, w), ba = act_of(dt, b), out = make_act(dt, "test::out", n * C);
  const FloatView mean = make_float("test::mean", n), rstd = make_float("test::rstd", n), gw = make_float("gw", C),
                  gb = make_float("gb", C);
  if (rms) {
    rmsnorm_forward(out, rstd, dx_, wa, n, C, 1e-5f);
    rmsnorm_backward(gx, gw, dd, dx_, wa, rstd, n, C);
  } else {
    layernorm_forward(out, mean, rstd, dx_, wa, ba, n, C, 1e-5f);
    layernorm_backward(gx, gw, gb, dd, dx_, wa, mean, rstd, n, C);
  }
  Kokkos::fence();
  NormRun r{floats_of(out), to_host(rstd), to_host(gx), to_host(gw), to_host(gb)};
  if (!rms) {
    const auto m = to_host(mean);
    r.stat.insert(r.stat.end(), m.begin(), m.end());
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

TEST(HostParallel, NormRowsAreBitwiseThoseOfEachRowAloneAtAnyThreadCount) {
  // ops/layernorm and ops/rmsnorm run several rows' sums side by side on the host
  // (for_each_row_block): every row's outputs are bitwise those of the row run alone, whatever
  // its place in a block, the rows left over and the thread count; so are the weight gradients
  for (const bool rms : {false, true})
    for (const DType dt : {DType::F32, DType::BF16, DType::F16})
      for (const auto& shape : {std::pair<std::int64_t, std::int64_t>{29, 37}, {21, 768}}) {
        const std::int64_t N = shape.first, C = shape.second;  // named: the lambdas below capture them
        const std::string what = std::string(rms ? "rmsnorm " : "layernorm ") + dtype_name(dt) + " " +
                                 std::to_string(N) + "x" + std::to_string(C);
        const auto x = random_vector(static_cast<size_t>(N * C), 31, 2.f),
                   dout = random_vector(static_cast<size_t>(N * C), 32),
                   dx0 = random_vector(static_cast<size_t>(N * C), 33), w = random_vector(static_cast<size_t>(C), 34),
                   b = random_vector(static_cast<size_t>(C), 35);
        NormRun all;
        at_threads(1, [&] { all = run_norm(rms, dt, x, dout, dx0, w, b, 0, N, C); });
        for (std::int64_t r = 0; r < N; ++r) {
          NormRun one;
          at_threads(1, [&] { one = run_norm(rms, dt, x, dout, dx0, w, b, r, 1, C); });
          ASSERT_TRUE(same_bits(one.out, rows_of(all.out, r, 1, C))) << what << ": output of row " << r;
          ASSERT_TRUE(same_bits(one.dx, rows_of(all.dx, r, 1, C))) << what << ": dx of row " << r;
          const std::int64_t stats = rms ? 1 : 2;
          for (std::int64_t s = 0; s < stats; ++s)
            ASSERT_EQ(std::memcmp(&one.stat[static_cast<size_t>(s)], &all.stat[static_cast<size_t>(s * N + r)],
                                  sizeof(float)),
                      0)
                << what << ": statistic " << s << " of row " << r;
        }
        for (int t : kThreads) {
          NormRun got;
          at_threads(t, [&] { got = run_norm(rms, dt, x, dout, dx0, w, b, 0, N, C); });
          EXPECT_TRUE(same_bits(got.out, all.out) && same_bits(got.stat, all.stat) && same_bits(got.dx, all.dx) &&
                      same_bits(got.dw, all.dw) && same_bits(got.db, all.db))
              << what << ": threads " << t;
        }
      }
}
