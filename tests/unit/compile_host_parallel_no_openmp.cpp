// Build check: common/host_parallel.hpp as a CUDA build or a build without OpenMP compiles it
// (no TRIDENT_HOST_OPENMP, no -fopenmp), every helper instantiated. The target is part of the
// default build, so a header that only compiles with OpenMP fails the build here, not on a GPU.
#include "common/host_parallel.hpp"

namespace trident {
double host_parallel_without_openmp(const FloatView& x, std::int64_t rows, std::int64_t cols) {
  for_each_index(
      "check::index", rows * cols, KOKKOS_LAMBDA(std::int64_t i) { x(i) = 1.f; });
  for_each_element(
      "check::element", rows, cols, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) { x(i) += c; });
  for_each_chunk(
      "check::chunk", rows, KOKKOS_LAMBDA(std::int64_t r) { x(r * cols) *= 2.f; });
#if !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP)  // a host-only helper
  for_each_row_block<4>("check::row_block", rows, [=](auto block, std::int64_t r0) {
    for (int k = 0; k < decltype(block)::value; ++k) x((r0 + k) * cols) -= 1.f;
  });
#endif
  return sum_chunks(
      "check::sum", rows, KOKKOS_LAMBDA(std::int64_t r) { return static_cast<double>(x(r * cols)); });
}
}  // namespace trident
