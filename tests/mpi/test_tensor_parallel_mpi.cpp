// The tensor/sequence-parallel region operations under MPI (np = 2): forward semantics
// against a direct computation, and each backward as the adjoint of its forward:
// <f(x), y> summed over ranks equals <x, f_backward(y)> summed over ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/topology.hpp"
#include "layers/tensor_parallel.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
double global_dot(const Communicator& c, const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return c.allreduce_sum(s);
}
}  // namespace

class TensorParallelOps : public ::testing::Test {
 protected:
  void SetUp() override {
    topo = std::make_unique<Topology>(MPI_COMM_WORLD, world_size(), 1);
    tp.comm = &topo->tp_group();
    p = tp.size();
    r = tp.rank();
  }
  std::unique_ptr<Topology> topo;
  TensorParallel tp;
  std::int64_t p = 1, r = 0;
};

TEST_F(TensorParallelOps, RowGatherAndReduceScatterAreAdjoint) {
  const std::int64_t rows = 4 * p, cols = 3, local = rows / p;
  auto x = random_vector(local * cols, 100 + r), y = random_vector(rows * cols, 200 + r);
  FloatView gx = make_float("gx", rows * cols), ry = make_float("ry", local * cols);
  tp_gather_rows(tp, gx, to_device(x), local, cols);
  tp_reduce_scatter_rows(tp, ry, to_device(y), rows, cols);
  auto g = to_host(gx), s = to_host(ry);
  // forward semantics: rank k's rows appear at block k
  for (std::int64_t i = 0; i < local * cols; ++i) EXPECT_EQ(g[r * local * cols + i], x[i]);
  EXPECT_NEAR(global_dot(*tp.comm, g, y), global_dot(*tp.comm, x, s), 1e-4);
}

TEST_F(TensorParallelOps, AllReduceIsCopyToBackwardAndReduceFromForward) {
  const std::int64_t n = 10;
  auto x = random_vector(n, 300 + r);
  auto d = to_device(x);
  tp_allreduce(tp, d, n);
  auto got = to_host(d);
  std::vector<float> all(n * p);
  MPI_Allgather(x.data(), n, MPI_FLOAT, all.data(), n, MPI_FLOAT, tp.comm->get());
  for (std::int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (std::int64_t k = 0; k < p; ++k) s += all[k * n + i];
    EXPECT_NEAR(got[i], s, 1e-5);
  }
}

TEST_F(TensorParallelOps, ColumnScatterAndGatherAreInverseAndAdjoint) {
  const std::int64_t rows = 3, cols = 2 * p, local = cols / p;
  auto full = random_vector(rows * cols, 400);  // the same on every rank (replicated input)
  FloatView mine = make_float("mine", rows * local), back = make_float("back", rows * cols),
            scratch = make_float("scratch", rows * cols);
  tp_scatter_columns(tp, mine, to_device(full), rows, cols);
  tp_gather_columns(tp, back, mine, scratch, rows, local);
  auto b = to_host(back);
  for (std::int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(b[i], full[i]);
  auto m = to_host(mine);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t c = 0; c < local; ++c) EXPECT_EQ(m[i * local + c], full[i * cols + r * local + c]);
}

TEST_F(TensorParallelOps, RowScatterKeepsMyBlock) {
  const std::int64_t rows = 2 * p, cols = 3, local = rows / p;
  auto full = random_vector(rows * cols, 500);
  FloatView mine = make_float("mine", local * cols);
  tp_scatter_rows(tp, mine, to_device(full), rows, cols);
  auto m = to_host(mine);
  for (std::int64_t i = 0; i < local * cols; ++i) EXPECT_EQ(m[i], full[r * local * cols + i]);
}
