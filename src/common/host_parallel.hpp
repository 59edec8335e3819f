// Chunked loops for memory-bound host kernels (issue 22, docs/DESIGN.md "Host threads").
// for_each_chunk(name, chunks, f) runs f(c) once for every c in [0, chunks): through
// Kokkos::parallel_for on the execution space, except under Kokkos' Serial host space (Debian's
// Kokkos) in a folder built with OpenMP (TRIDENT_HOST_OPENMP), where this rank's OpenMP threads
// share the chunks (OMP_NUM_THREADS, or the driver's share of the node's cores per rank, as the
// GEMMs use). Each chunk runs whole on one thread, so elementwise kernels give bitwise the same
// results whatever the thread count. TRIDENT_HOST_OPENMP=0 in the environment turns the sharing
// off (one thread, as before; for A/B measurements).
#pragma once
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/types.hpp"

namespace trident {

template <class F>
void for_each_chunk(const char* name, std::int64_t chunks, const F& f) {
#if defined(TRIDENT_HOST_OPENMP) && defined(KOKKOS_ENABLE_SERIAL)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Serial>) {
    static const bool shared = [] {
      const char* v = std::getenv("TRIDENT_HOST_OPENMP");
      return !(v && std::strcmp(v, "0") == 0);
    }();
    if (shared) {
#pragma omp parallel for schedule(static)
      for (std::int64_t c = 0; c < chunks; ++c) f(c);
      return;
    }
  }
#endif
  Kokkos::parallel_for(name, range(chunks), f);
}

}  // namespace trident
