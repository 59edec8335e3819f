// The job-wide MPI calls of comm/mpi_job.hpp, with MPI's return codes checked.
#include "comm/mpi_job.hpp"

#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
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

namespace {
WaitChoice g_wait;

// This node's ranks, the CPUs they may run on (the union of their affinity masks: a launcher that
// binds each rank to its own cores gives disjoint masks, an unbound job the whole machine to every
// rank) and whether any node of the job has more ranks than CPUs. Collective over the world the
// first time (every rank reaches it at the same point: the app driver's start); fixed after.
struct NodeCpus {
  int ranks = 1, cpus = 1;
  bool oversubscribed = false;
};
const NodeCpus& node_cpus() {
  static const NodeCpus facts = [] {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    constexpr int kWords = CPU_SETSIZE / 64;
    std::uint64_t words[kWords] = {};
    if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) words[c / 64] |= std::uint64_t{1} << (c % 64);
    }
    MPI_Comm node = MPI_COMM_NULL;
    TRIDENT_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node));
    NodeCpus f;
    TRIDENT_CHECK_MPI(MPI_Comm_size(node, &f.ranks));
    TRIDENT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, words, kWords, MPI_UINT64_T, MPI_BOR, node));
    TRIDENT_CHECK_MPI(MPI_Comm_free(&node));
    f.cpus = 0;
    for (std::uint64_t w : words) f.cpus += __builtin_popcountll(w);
    if (f.cpus == 0) f.cpus = 1;  // no affinity figures: count one CPU
    int over = f.ranks > f.cpus ? 1 : 0;
    TRIDENT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &over, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    f.oversubscribed = over != 0;
    return f;
  }();
  return facts;
}
}  // namespace

const WaitChoice& choose_wait_policy(const std::string& deck_setting) {
  // auto defers to TRIDENT_MPI_WAIT where the environment sets it (the same on every rank: the
  // launcher passes the environment on)
  const char* env = std::getenv("TRIDENT_MPI_WAIT");
  const std::string setting = deck_setting == "auto" && env && *env ? std::string(env) : deck_setting;
  TRIDENT_REQUIRE(setting == "auto" || setting == "spin" || setting == "yield",
                  (setting == deck_setting ? "parallel.mpi_wait = " : "TRIDENT_MPI_WAIT=")
                      << setting << ": expected auto, spin or yield");
  const NodeCpus& n = node_cpus();
  g_wait.setting = setting;
  g_wait.from_environment = setting != deck_setting;
  g_wait.node_ranks = n.ranks;
  g_wait.node_cpus = n.cpus;
  g_wait.oversubscribed = n.oversubscribed;
  g_wait.policy = setting == "yield" || (setting == "auto" && n.oversubscribed) ? WaitPolicy::yield : WaitPolicy::spin;
  return g_wait;
}

WaitPolicy wait_policy() { return g_wait.policy; }

const WaitChoice& wait_choice() { return g_wait; }

void set_wait_policy(WaitPolicy policy) { g_wait.policy = policy; }

std::string describe_wait_choice() {
  const WaitChoice& w = g_wait;
  return std::string(w.policy == WaitPolicy::yield ? "yield" : "spin") + " (" + std::to_string(w.node_ranks) +
         (w.node_ranks == 1 ? " rank" : " ranks") + " on the " + std::to_string(w.node_cpus) +
         (w.node_cpus == 1 ? " CPU" : " CPUs") + " of this node" +
         (w.oversubscribed && w.node_ranks <= w.node_cpus ? ", more ranks than CPUs on another node" : "") +
         (w.from_environment ? "; TRIDENT_MPI_WAIT=" : "; parallel.mpi_wait = ") + w.setting + ")";
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
