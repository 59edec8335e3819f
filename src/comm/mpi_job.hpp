// The MPI job as a whole: starting and ending MPI, the world's rank and size, the ranks sharing
// this node, the wall clock, and ending every rank at once. The apps' driver (runtime/app_driver)
// and the watchdog (train/watchdog) are its users; everything else talks to groups through
// comm/communicator.hpp.
#pragma once

namespace trident::mpi_job {

void init(int* argc, char*** argv);
void finalize();
bool finalized();
int world_rank();
int world_size();

// This rank's place among the ranks on its node (MPI_COMM_TYPE_SHARED; collective over the world).
struct NodePlace {
  int rank = 0;  // node-local rank
  int size = 1;  // ranks on this node
};
NodePlace node_place();

// Seconds on MPI's wall clock.
double wall_time();

// Ends every rank of the job with this exit code (MPI_Abort on the world).
[[noreturn]] void abort_job(int exit_code);

}  // namespace trident::mpi_job
