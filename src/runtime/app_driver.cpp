// run_app and run_deck_app (app_driver.hpp): the stop-signal watcher before MPI_Init, --version
// printed by rank 0 before Kokkos starts, OpenMP threads shared by the ranks of a node, in CUDA
// builds the GPU of the node-local rank, Kokkos around the body, and the error exits of
// docs/DESIGN.md "Two kinds of error": an Error::all waits up to TRIDENT_ERROR_GRACE_S seconds in
// a barrier on a duplicate of MPI_COMM_WORLD (Communicator::barrier_within) and returns 1
// (printed once by rank 0) when every rank arrives; otherwise, like any other error, it is
// printed with the rank and the job aborted (docs/DESIGN.md "Exit codes").
#include "runtime/app_driver.hpp"

#include "io/deck.hpp"

#include <malloc.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <iostream>
#include <string>
#include <vector>
#if defined(TRIDENT_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include "comm/communicator.hpp"
#include "comm/mpi_job.hpp"
#include "common/error.hpp"
#include "io/hdf5_handle.hpp"
#include "ops/gemm.hpp"
#include "train/stop_signal.hpp"

#include <cstdlib>
#include <thread>
#if defined(TRIDENT_HAVE_OPENMP)
#include <omp.h>
#endif

namespace trident {

namespace {

bool asks(int argc, char** argv, std::initializer_list<const char*> flags) {
  for (int i = 1; i < argc; ++i)
    for (const char* f : flags)
      if (std::string(argv[i]) == f) return true;
  return false;
}
bool asks_version(int argc, char** argv) { return asks(argc, argv, {"--version"}); }

// What every app's --help ends with, after the app's own usage and options: the exit codes
// (docs/DESIGN.md "Exit codes") and where Kokkos's own options are.
const char* kHelpFooter =
    "\nExit codes:\n"
    "  0  done (all iterations, evaluation or generation done; --help, --version)\n"
    "  1  an error (one line naming it; the whole job ends)\n"
    "  3  stopped by SIGUSR1 or SIGTERM after writing a checkpoint: resubmit to continue\n"
    "  4  stopped by a signal with nothing to resume (no checkpoint.save, or outside training)\n"
    "  5  the watchdog ended a stuck job: resubmit to continue\n"
    "\nKokkos's own options (--kokkos-num-threads, --kokkos-device-id, ...): --kokkos-help lists them.\n";

// --version: what this executable was built with and runs on, printed by rank 0 after MPI has
// started and before Kokkos does: it proves that the executable loads its libraries and that MPI
// initialises, without touching a GPU (scripts/gpu_check.sh's start check).
void print_version(const char* argv0) {
  std::string app = argv0;
  if (const auto slash = app.rfind('/'); slash != std::string::npos) app = app.substr(slash + 1);
  const int kv = KOKKOS_VERSION;
  std::printf("%s (Trident %s)\n", app.c_str(), TRIDENT_VERSION_STRING);
#if defined(TRIDENT_ENABLE_CUDA)
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 where no driver is installed
  std::printf("backend: CUDA (sm_%s), CUDA runtime %d.%d, driver %s\n", TRIDENT_CUDA_ARCHS, runtime / 1000,
              runtime % 1000 / 10,
              driver ? (std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10)).c_str() : "none");
#else
  std::printf("backend: host\n");
#endif
  std::printf("Kokkos: %d.%d.%d, default execution space %s\n", kv / 10000, kv / 100 % 100, kv % 100,
              Kokkos::DefaultExecutionSpace::name());
  std::printf("GEMM: %s\n%s\nHDF5: %s\n", gemm_backend_name(), comm_library_versions().c_str(),
              hdf5_library_version().c_str());
}

// An Error::all is meant to be met by every rank at the same point; when it is, the ranks agree on
// it here and leave cleanly (rank 0 prints it once, every rank returns 1). When only some ranks
// met it (a file only rank 0 writes, a read on one data-parallel rank), the others are busy in a
// collective and never arrive: after `grace` seconds the rank that met it prints the error with
// its rank and aborts the whole job, so that nothing hangs. The agreement runs on a duplicate of
// MPI_COMM_WORLD made at start-up, apart from every collective the body uses.
int leave_after_error(const Communicator& agree, int rank, const char* what) {
  double grace = 5.0;
  if (const char* g = std::getenv("TRIDENT_ERROR_GRACE_S")) grace = std::atof(g);
  if (agree.barrier_within(grace)) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", what);
    return kExitFailure;
  }
  std::fprintf(stderr, "error (rank %d): %s\n(not every rank met this error within %.0f s: aborting the job)\n", rank,
               what, grace);
  std::fflush(stderr);
  mpi_job::abort_job(kExitFailure);
}

// Any other error: printed with the rank, and the whole job ends.
[[noreturn]] void abort_after_error(int rank, const char* what) {
  std::fprintf(stderr, "error (rank %d): %s\n", rank, what);
  std::fflush(stderr);
  mpi_job::abort_job(kExitFailure);
}

}  // namespace

int run_app(int argc, char** argv, const std::function<int(int, char**)>& body) {
  // Keep freed buffers in the heap instead of returning them to the OS: GEMM libraries
  // allocate large scratch per call, and fresh pages cost a page fault each.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // SIGUSR1 / SIGTERM go to one watcher thread (train/stop_signal.hpp): masked before MPI starts
  // its threads, so that they inherit the mask
  install_stop_signal_watcher();
  mpi_job::init(&argc, &argv);
  const int rank = mpi_job::world_rank();
  set_stop_signal_rank(rank);
  if (asks_version(argc, argv)) {
    if (rank == 0) print_version(argv[0]);
    std::fflush(stdout);
    mpi_job::finalize();
    return 0;
  }
  // ranks that share cores wait for MPI without spinning (a deck's parallel.mpi_wait decides
  // again once read: run_deck_app)
  mpi_job::choose_wait_policy("auto");
#if defined(TRIDENT_HAVE_OPENMP)
  // Host threads (GEMMs, host kernels): unless OMP_NUM_THREADS says otherwise, the node's cores are shared
  // evenly by the ranks on the node (several ranks each spawning one thread per core would
  // oversubscribe the node many times over).
  {
    const int local = mpi_job::node_place().size;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (!std::getenv("OMP_NUM_THREADS")) {
      omp_set_num_threads(cores / local > 1 ? cores / local : 1);
    } else if (omp_get_max_threads() > 1 && local * omp_get_max_threads() > cores && rank == 0) {
      // threads that share cores spin against each other at every GEMM and host kernel
      std::fprintf(stderr,
                   "warning: %d ranks x OMP_NUM_THREADS=%d threads on a node of %d cores oversubscribe it: the "
                   "GEMMs and host kernels slow down; set OMP_NUM_THREADS <= %d (or unset it)\n",
                   local, omp_get_max_threads(), cores, cores / local > 1 ? cores / local : 1);
    }
  }
#endif
  // Each rank drives the GPU of its node-local rank (ranks per node beyond the GPU count share
  // them round-robin); an explicit --kokkos-device-id on the command line wins.
  std::vector<std::string> args(argv, argv + argc);  // argv, plus --kokkos-device-id (CUDA)
#if defined(TRIDENT_ENABLE_CUDA)
  {
    bool given = false;
    for (const auto& a : args) given = given || a.rfind("--kokkos-device-id", 0) == 0;
    int devices = 0;
    if (!given && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
      const int local = mpi_job::node_place().rank;
      args.push_back("--kokkos-device-id=" + std::to_string(local % devices));
    }
  }
#endif
  // --help is the app's: Kokkos does not see it (it would print its own banner first); its own
  // options are listed by --kokkos-help, which runs nothing else
  const bool help = asks(argc, argv, {"--help", "-h"});
  const bool kokkos_help = asks(argc, argv, {"--kokkos-help"});
  std::vector<char*> kargv;  // (kargc + 1): args, then nullptr
  for (auto& a : args)
    if (a != "--help" && a != "-h" && (a != "--kokkos-help" || rank == 0)) kargv.push_back(a.data());
  int kargc = static_cast<int>(kargv.size());
  kargv.push_back(nullptr);
  int rc = 0;
  {
    const Communicator agree = Communicator::duplicate(MPI_COMM_WORLD);
    Kokkos::ScopeGuard kokkos(kargc, kargv.data());
    try {
      if (!kokkos_help) rc = body(argc, argv);
      if (help && !kokkos_help && rank == 0) std::cout << kHelpFooter << std::flush;
    } catch (const Error& e) {
      if (e.scope() == Error::Scope::all_ranks) {
        rc = leave_after_error(agree, rank, e.what());
        // an agreed error inside a parallel HDF5 file left it open (io/hdf5_handle.hpp): the job
        // ends here, since HDF5 would flush and close it at MPI_Finalize, rank by rank
        if (H5CollectiveScope::left_open()) mpi_job::abort_job(rc);
      } else
        abort_after_error(rank, e.what());
    } catch (const std::exception& e) {
      abort_after_error(rank, e.what());
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  mpi_job::finalize();
  return rc;
}

int run_deck_app(int argc, char** argv, int (*train)(const Deck&)) {
  return run_app(argc, argv, [train](int ac, char** av) {
    Deck deck;
    std::string help;
    if (!parse_deck(ac, av, deck, &help)) {
      if (mpi_job::world_rank() == 0) std::cout << help;
      return 0;
    }
    mpi_job::choose_wait_policy(deck.parallel.mpi_wait);
    return train(deck);
  });
}

}  // namespace trident
