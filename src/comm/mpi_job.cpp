// The job-wide MPI calls of comm/mpi_job.hpp, with MPI's return codes checked.
#include "comm/mpi_job.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/error.hpp"

namespace trident::mpi_job {

void init(int* argc, char*** argv) { TRIDENT_CHECK_MPI(MPI_Init(argc, argv)); }

void finalize() { TRIDENT_CHECK_MPI(MPI_Finalize()); }

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

int world_rank() {
  int rank = 0;
  TRIDENT_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

int world_size() {
  int size = 1;
  TRIDENT_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

NodePlace node_place() {
  MPI_Comm node = MPI_COMM_NULL;
  TRIDENT_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node));
  NodePlace place;
  TRIDENT_CHECK_MPI(MPI_Comm_rank(node, &place.rank));
  TRIDENT_CHECK_MPI(MPI_Comm_size(node, &place.size));
  TRIDENT_CHECK_MPI(MPI_Comm_free(&node));
  return place;
}

double wall_time() { return MPI_Wtime(); }

void abort_job(int exit_code) {
  // The launcher forwards a rank's output through pipes of its own, and an abort can reach it
  // before the last lines it was sent (the error that explains the abort): seen as an aborted job
  // with no message under MPICH's Hydra. The streams are flushed and the launcher is given a
  // moment to forward them before the job is torn down.
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, this rank still ends
}

}  // namespace trident::mpi_job
