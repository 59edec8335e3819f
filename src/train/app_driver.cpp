// App driver.
#include "train/app_driver.hpp"

#include <malloc.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <exception>

#include "common/error.hpp"

namespace trident {

int run_app(int argc, char** argv, const std::function<int(int, char**)>& body) {
  // Keep freed buffers in the heap instead of returning them to the OS: GEMM libraries
  // allocate large scratch per call, and fresh pages cost a page fault each.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      rc = body(argc, argv);
    } catch (const Error& e) {
      if (e.scope() == Error::Scope::all_ranks) {
        if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());
        rc = kExitFailure;
      } else {
        std::fprintf(stderr, "error (rank %d): %s\n", rank, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, kExitFailure);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error (rank %d): %s\n", rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, kExitFailure);
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Finalize();
  return rc;
}

}  // namespace trident
