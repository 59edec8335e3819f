// Host threads for the memory-bound kernels (issue 22, docs/DESIGN.md "Host threads").
//
// Every host kernel of ops/, layers/ and optim/ is launched through one of these three, which run
// through Kokkos on its execution space (CUDA, a site Kokkos' OpenMP or Threads), except under
// Kokkos' Serial host space (Debian's Kokkos) in a folder built with OpenMP (TRIDENT_HOST_OPENMP),
// where this rank's OpenMP threads share the work (OMP_NUM_THREADS, or the driver's share of the
// node's cores per rank, as the GEMMs use):
//   for_each_index(name, n, f)   f(i) for every i in [0, n), contiguous blocks per thread;
//   for_each_element(name, rows, cols, f)
//                                f(i, c) for every element i = r * cols + c of a row-major
//                                (rows, cols) matrix (a bias broadcast along the rows, without an
//                                integer division per element on the host);
//   for_each_chunk(name, c, f)   f(c) for every chunk c in [0, c); the kernel sizes its chunks;
//   sum_chunks(name, c, f)       the sum of f(c) (a double) over the chunks, added in chunk order
//                                on one thread, so the result is bitwise that of one thread.
// Each index or chunk runs whole on one thread, so every kernel gives bitwise the same results
// whatever the thread count. TRIDENT_HOST_OPENMP=0 in the environment turns the sharing off (one
// thread, as before; for A/B measurements). Under the sharing, a kernel still reports itself to a
// loaded Kokkos Tools library (perf's kernel timer) as a parallel_for / parallel_reduce.
#pragma once
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/types.hpp"

#if defined(TRIDENT_HOST_OPENMP)
#include <omp.h>
#endif

namespace trident {

namespace detail {
#if defined(TRIDENT_HOST_OPENMP) && defined(KOKKOS_ENABLE_SERIAL)
inline constexpr bool kHostSharing = std::is_same_v<ExecSpace, Kokkos::Serial>;
#else
inline constexpr bool kHostSharing = false;
#endif

// Whether this process shares host kernels over its threads (TRIDENT_HOST_OPENMP, default on).
inline bool host_sharing_on() {
  static const bool on = [] {
    const char* v = std::getenv("TRIDENT_HOST_OPENMP");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

#if defined(TRIDENT_HOST_OPENMP)
// This thread's contiguous block [b, e) of [0, n) inside a parallel region.
inline void thread_block(std::int64_t n, std::int64_t& b, std::int64_t& e) {
  const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), q = n / nt, r = n % nt;
  b = t * q + (t < r ? t : r);
  e = b + q + (t < r ? 1 : 0);
}
#endif

// The loops a thread runs over its block, on the thread's own copy of the kernel: the copy's
// members (view pointers, sizes) then provably stay put while the loop stores through them, so
// the compiler keeps them in registers and vectorises as Kokkos' own dispatch allows (through a
// shared reference every store might change them: measured 2-5x slower). The copy is made with
// Kokkos' view reference counting off on this thread, as Kokkos' dispatch does.
template <class F>
void run_indices(const F& shared, std::int64_t b, std::int64_t e) {
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_disable();
  {
    const F f(shared);
    for (std::int64_t i = b; i < e; ++i) f(i);
  }
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_enable();
}
template <class F>
void run_rows(const F& shared, std::int64_t cols, std::int64_t b, std::int64_t e) {
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_disable();
  {
    const F f(shared);
    for (std::int64_t r = b; r < e; ++r)
      for (std::int64_t c = 0; c < cols; ++c) f(r * cols + c, c);
  }
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_enable();
}
template <class F>
void run_partials(const F& shared, double* out, std::int64_t b, std::int64_t e) {
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_disable();
  {
    const F f(shared);
    for (std::int64_t c = b; c < e; ++c) out[c] = f(c);
  }
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_enable();
}

// A kernel run outside Kokkos, as Kokkos Tools see it (begin/end of a parallel_for or _reduce).
class ToolsKernel {
 public:
  ToolsKernel(const char* name, bool reduce) : reduce_(reduce), on_(Kokkos::Profiling::profileLibraryLoaded()) {
    if (!on_) return;
    if (reduce_)
      Kokkos::Profiling::beginParallelReduce(std::string(name), 0, &id_);
    else
      Kokkos::Profiling::beginParallelFor(std::string(name), 0, &id_);
  }
  ~ToolsKernel() {
    if (!on_) return;
    if (reduce_)
      Kokkos::Profiling::endParallelReduce(id_);
    else
      Kokkos::Profiling::endParallelFor(id_);
  }
  ToolsKernel(const ToolsKernel&) = delete;
  ToolsKernel& operator=(const ToolsKernel&) = delete;

 private:
  bool reduce_;
  bool on_;
  std::uint64_t id_ = 0;
};
}  // namespace detail

template <class F>
void for_each_index(const char* name, std::int64_t n, const F& f) {
  if constexpr (detail::kHostSharing) {
    if (detail::host_sharing_on()) {
      detail::ToolsKernel k(name, false);
#pragma omp parallel
      {
        std::int64_t b, e;
        detail::thread_block(n, b, e);
        detail::run_indices(f, b, e);
      }
      return;
    }
  }
  Kokkos::parallel_for(name, range(n), f);
}

template <class F>
void for_each_element(const char* name, std::int64_t rows, std::int64_t cols, const F& f) {
  if constexpr (detail::kHostSharing) {
    if (detail::host_sharing_on()) {
      detail::ToolsKernel k(name, false);
#pragma omp parallel
      {
        std::int64_t b, e;
        detail::thread_block(rows, b, e);
        detail::run_rows(f, cols, b, e);
      }
      return;
    }
  }
  Kokkos::parallel_for(
      name, range(rows * cols), KOKKOS_LAMBDA(std::int64_t i) { f(i, i % cols); });
}

template <class F>
void for_each_chunk(const char* name, std::int64_t chunks, const F& f) {
  for_each_index(name, chunks, f);
}

template <class F>
double sum_chunks(const char* name, std::int64_t chunks, const F& f) {
  if constexpr (detail::kHostSharing) {
    if (detail::host_sharing_on()) {
      detail::ToolsKernel k(name, true);
      std::vector<double> part(static_cast<size_t>(chunks));
      double* out = part.data();
#pragma omp parallel
      {
        std::int64_t b, e;
        detail::thread_block(chunks, b, e);
        detail::run_partials(f, out, b, e);
      }
      double total = 0;
      for (std::int64_t c = 0; c < chunks; ++c) total += out[c];
      return total;
    }
  }
  double total = 0;
  Kokkos::parallel_reduce(
      name, range(chunks), KOKKOS_LAMBDA(std::int64_t c, double& acc) { acc += f(c); }, total);
  return total;
}

}  // namespace trident
