// The MPI job as a whole: starting and ending MPI, the world's rank and size, the ranks sharing
// this node, the wall clock, and ending every rank at once. The apps' driver (runtime/app_driver)
// and the watchdog (train/watchdog) are its users; everything else talks to groups through
// comm/communicator.hpp.
#pragma once

#include <string>

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

// How a rank waits for MPI. spin: the library's blocking calls, which poll a core until the data
// arrives (the fastest when every rank has cores of its own). yield: the nonblocking calls,
// tested in a loop that gives the core up between tests, so that ranks sharing cores let the rank
// they wait for run (MPICH polls without yielding; 4 ranks on 2 cores wait milliseconds per small
// all-reduce). comm/communicator.cpp follows the policy. It is job-wide: a blocking collective
// does not match a nonblocking one, so every rank must use the same policy at every call.
enum class WaitPolicy { spin, yield };
struct WaitChoice {
  WaitPolicy policy = WaitPolicy::spin;
  std::string setting = "auto";   // auto | spin | yield
  bool from_environment = false;  // the setting is TRIDENT_MPI_WAIT's (else parallel.mpi_wait's)
  int node_ranks = 1;             // this node's ranks
  int node_cpus = 1;              // the CPUs they may run on (the union of their affinity masks)
  bool oversubscribed = false;    // some node of the job has more ranks than CPUs
};
// Decides the policy from a setting (auto: yield when some node has more ranks than CPUs) and
// makes it the job's. An auto setting takes TRIDENT_MPI_WAIT's value where the environment has
// one (auto, spin or yield: the default of every app, decks or not). Every rank must pass the same
// setting; the first call is collective over the world (the node's ranks and CPUs, counted once).
const WaitChoice& choose_wait_policy(const std::string& setting);
// The job's policy (spin until choose_wait_policy or set_wait_policy ran).
WaitPolicy wait_policy();
const WaitChoice& wait_choice();
// Sets the policy outright (tests). Every rank must set the same one between the same calls.
void set_wait_policy(WaitPolicy policy);
// "yield (8 ranks on the 2 CPUs of this node; parallel.mpi_wait = auto)": the choice, for the
// run's header.
std::string describe_wait_choice();

// Seconds on MPI's wall clock.
double wall_time();

// Ends every rank of the job with this exit code (MPI_Abort on the world).
[[noreturn]] void abort_job(int exit_code);

}  // namespace trident::mpi_job
