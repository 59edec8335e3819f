// Stop-signal handling and checkpoint.load = auto.
//
// SIGUSR1 and SIGTERM are blocked in every thread (the mask is set before MPI, UCX, OpenMP or
// the data prefetcher start theirs, and threads inherit it) and taken by one watcher thread with
// sigwait(): no thread is ever interrupted by them, so no library sees an EINTR it might mishandle
// (an asynchronous handler corrupted the heap now and then under MPICH + UCX).
#include "train/stop_signal.hpp"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace trident {

namespace {
std::atomic<int> g_signal{0};
std::atomic<bool> g_wanted{false};  // a StopSignal exists: the run checkpoints and exits

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
      if (!g_wanted.load()) std::_Exit(128 + sig);  // no run to stop cleanly: the default action's code
      int none = 0;
      g_signal.compare_exchange_strong(none, sig);
    }
  }).detach();
}

StopSignal::StopSignal() {
  install_stop_signal_watcher();  // no-op when the app driver installed it first
  g_signal = 0;
  g_wanted = true;
}

StopSignal::~StopSignal() { g_wanted = false; }

int StopSignal::agreed(const Communicator& world) const {
  return static_cast<int>(world.allreduce_max(static_cast<double>(g_signal.load())));
}

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
