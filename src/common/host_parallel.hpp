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
//   for_each_row_block<R>(name, rows, f)
//                                f(std::integral_constant<int, R>{}, r0) for every whole block of
//                                R rows from r0, then f(std::integral_constant<int, 1>{}, r) for
//                                each row left over: a kernel whose rows each reduce in sequence
//                                (the norms' sums) runs R rows' chains side by side, each row's
//                                operations and their order those of a row alone;
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

// One thread's block [b, e): loop(f, b, e) on the thread's own copy f of the kernel. The copy's
// members (view pointers, sizes) then provably stay put while the loop stores through them, so
// the compiler keeps them in registers and vectorises as Kokkos' own dispatch allows (through a
// shared reference every store might change them: measured 2-5x slower). The copy is made with
// Kokkos' view reference counting off on this thread, as Kokkos' dispatch does.
template <class F, class Loop>
void run_block(const F& shared, const Loop& loop, std::int64_t b, std::int64_t e) {
  Kokkos::Impl::SharedAllocationRecord<void, void>::tracking_disable();
  {
    const F f(shared);
    loop(f, b, e);
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
// Whether this process's host kernels are shared over its threads (see the top of this file).
inline bool sharing() { return kHostSharing && host_sharing_on(); }

// The work [0, n) cut into one contiguous block per thread of this rank, each thread running
// run_block(shared, loop, ...) on its block; a kernel to Kokkos Tools. Only when sharing().
template <class F, class Loop>
void over_threads(const char* name, bool reduce, std::int64_t n, const F& shared, const Loop& loop) {
#if defined(TRIDENT_HOST_OPENMP)
  ToolsKernel k(name, reduce);
#pragma omp parallel
  {
    std::int64_t b, e;
    thread_block(n, b, e);
    run_block(shared, loop, b, e);
  }
#else
  (void)name, (void)reduce, (void)n, (void)shared, (void)loop;
#endif
}
}  // namespace detail

template <class F>
void for_each_index(const char* name, std::int64_t n, const F& f) {
  if (detail::sharing()) {
    detail::over_threads(name, false, n, f, [](const F& g, std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) g(i);
    });
    return;
  }
  Kokkos::parallel_for(name, range(n), f);
}

template <class F>
void for_each_element(const char* name, std::int64_t rows, std::int64_t cols, const F& f) {
  if (detail::sharing()) {  // blocks of rows
    detail::over_threads(name, false, rows, f, [cols](const F& g, std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r)
        for (std::int64_t c = 0; c < cols; ++c) g(r * cols + c, c);
    });
    return;
  }
  Kokkos::parallel_for(
      name, range(rows * cols), KOKKOS_LAMBDA(std::int64_t i) { f(i, i % cols); });
}

// Host kernels only (a device runs a row per team, common/device_parallel): f is a host lambda,
// generic in its first argument, which nvcc does not allow of a __host__ __device__ one.
template <int R, class F>
void for_each_row_block(const char* name, std::int64_t rows, const F& f) {
  static_assert(R >= 1, "a block holds at least one row");
  static_assert(sizeof(F) > 0 && std::is_same_v<typename ExecSpace::memory_space, Kokkos::HostSpace>,
                "for_each_row_block runs host kernels only");
  const std::int64_t whole = rows / R;
  for_each_index(name, whole + rows % R, [=](std::int64_t i) {
    if (i < whole)
      f(std::integral_constant<int, R>{}, i * R);
    else
      f(std::integral_constant<int, 1>{}, whole * R + (i - whole));
  });
}

template <class F>
void for_each_chunk(const char* name, std::int64_t chunks, const F& f) {
  for_each_index(name, chunks, f);
}

template <class F>
double sum_chunks(const char* name, std::int64_t chunks, const F& f) {
  if (detail::sharing()) {  // the partials in place, then added in chunk order on this thread
    std::vector<double> part(static_cast<size_t>(chunks));
    double* out = part.data();
    detail::over_threads(name, true, chunks, f, [out](const F& g, std::int64_t b, std::int64_t e) {
      for (std::int64_t c = b; c < e; ++c) out[c] = g(c);
    });
    double total = 0;
    for (std::int64_t c = 0; c < chunks; ++c) total += out[c];
    return total;
  }
  double total = 0;
  Kokkos::parallel_reduce(
      name, range(chunks), KOKKOS_LAMBDA(std::int64_t c, double& acc) { acc += f(c); }, total);
  return total;
}

}  // namespace trident
