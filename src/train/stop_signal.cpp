// Stop-signal handling and checkpoint.load = auto.
//
// SIGUSR1 and SIGTERM are blocked in every thread (the mask is set before MPI, UCX, OpenMP or
// the data prefetcher start theirs, and threads inherit it) and taken by one watcher thread with
// sigwait(): no thread is ever interrupted by them, so no library sees an EINTR it might mishandle
// (an asynchronous handler corrupted the heap now and then under MPICH + UCX).
#include "train/stop_signal.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace trident {

namespace {
std::atomic<int> g_signal{0};
// kIdle: no training loop (start-up, shut-down, other apps): a signal ends the process;
// kArmed: a StopSignal is armed: the run checkpoints and exits; kEnding: the watcher ends it.
enum : int { kIdle = 0, kArmed = 1, kEnding = 2 };
std::atomic<int> g_state{kIdle};
std::atomic<int> g_rank{-1};  // this process's world rank once MPI has started

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGUSR1);
  sigaddset(&s, SIGTERM);
  return s;
}
}  // namespace

void install_stop_signal_watcher() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  const sigset_t s = stop_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  std::thread([s] {
    for (;;) {
      int sig = 0;
      if (sigwait(&s, &sig) != 0) continue;
      if (g_state.load() != kArmed) {
        const int rank = g_rank.load();
        // Rank 0 (or a process before MPI) says why and ends at once. Another rank first waits up
        // to 2 s: where every rank took the signal (Slurm, a launcher's forwarding) rank 0's
        // message comes first and the launcher ends this process with the job; where the training
        // loop starts meanwhile, the signal is the loop's to act on (its next iteration boundary);
        // otherwise this rank took it alone, and says so itself.
        if (rank > 0)
          for (int i = 0; i < 200 && g_state.load() != kArmed; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        int idle = kIdle;
        if (g_state.compare_exchange_strong(idle, kEnding)) {
          // write(2) only: this thread may not take the stdio locks another thread holds
          char msg[320];
          const char* name = sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal";
          const char* what =
              "outside the training loop (during start-up or shut-down): nothing is trained that a checkpoint "
              "could keep; stopping now with exit code";
          const int n = rank > 0 ? std::snprintf(msg, sizeof msg, "trident: rank %d received %s %s %d\n", rank, name,
                                                 what, kExitStoppedNoCheckpoint)
                                 : std::snprintf(msg, sizeof msg, "trident: received %s %s %d\n", name, what,
                                                 kExitStoppedNoCheckpoint);
          if (n > 0) (void)!::write(2, msg, static_cast<std::size_t>(std::min<int>(n, sizeof msg - 1)));
          std::_Exit(kExitStoppedNoCheckpoint);
        }
        // the loop was armed meanwhile: recorded below like a signal inside it
      }
      int none = 0;
      g_signal.compare_exchange_strong(none, sig);
    }
  }).detach();
}

void set_stop_signal_rank(int rank) { g_rank = rank; }

StopSignal::StopSignal() {
  install_stop_signal_watcher();  // no-op when the app driver installed it first
  g_signal = 0;
}

void StopSignal::arm() {
  int idle = kIdle;
  g_state.compare_exchange_strong(idle, kArmed);  // not when the watcher is ending the process
}

StopSignal::~StopSignal() {
  int armed = kArmed;
  g_state.compare_exchange_strong(armed, kIdle);
}

int StopSignal::agreed(const Communicator& world) const {
  return static_cast<int>(world.allreduce_max(static_cast<double>(g_signal.load())));
}

int StopSignal::seen() const { return g_signal.load(); }

std::string StopSignal::name(int signal) {
  return signal == SIGUSR1 ? "SIGUSR1" : signal == SIGTERM ? "SIGTERM" : "signal " + std::to_string(signal);
}

std::string auto_checkpoint(const std::string& load, const std::string& save, const Communicator& world) {
  if (load != "auto") return load;
  std::error_code ec;
  const double found = world.rank() == 0 && !save.empty() &&
                       std::filesystem::exists(std::filesystem::path(save) / "latest", ec);
  return world.allreduce_max(found) > 0 ? save : std::string();
}

}  // namespace trident
