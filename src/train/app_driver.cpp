// App driver.
#include "train/app_driver.hpp"

#include <malloc.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <exception>

#include "common/error.hpp"

#if defined(TRIDENT_HAVE_OPENMP)
#include <omp.h>

#include <cstdlib>
#include <thread>
#endif

namespace trident {

int run_app(int argc, char** argv, const std::function<int(int, char**)>& body) {
  // Keep freed buffers in the heap instead of returning them to the OS: GEMM libraries
  // allocate large scratch per call, and fresh pages cost a page fault each.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#if defined(TRIDENT_HAVE_OPENMP)
  // Host GEMM threads: unless OMP_NUM_THREADS says otherwise, the node's cores are shared
  // evenly by the ranks on the node (several ranks each spawning one thread per core would
  // oversubscribe the node many times over).
  if (!std::getenv("OMP_NUM_THREADS")) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    omp_set_num_threads(cores / local > 1 ? cores / local : 1);
  }
#endif
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
