// Watchdog: a per-iteration deadline, so that a stuck job (a stopped or dead node, a hung
// collective, a file system that stopped answering) ends within minutes instead of holding its
// allocation until the time limit. A thread per rank compares the time spent in the current phase
// of the training loop with its deadline: max(watchdog.min_s, watchdog.factor x the median of the
// iteration times measured after watchdog.warmup_iters) for an iteration; watchdog.startup_s for
// the warm-up iterations, evaluations and checkpoint saves. A rank past its deadline prints where
// it is (phase, communication call, group, peer: common/progress.hpp) and aborts the job with
// kExitWatchdog, which the job scripts treat as "requeue": --checkpoint.load auto then resumes
// from the last checkpoint. (NCCL's watchdog plays this part for GPU collectives in PyTorch.)
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "io/deck.hpp"

namespace trident {

inline constexpr int kExitWatchdog = 5;  // the watchdog ended a stuck job: resubmit to continue

// The deck's [watchdog] section (enable, factor, min_s, startup_s, warmup_iters).
using WatchdogOptions = Deck::Watchdog;

class Watchdog {
 public:
  Watchdog(const WatchdogOptions& options, int world_rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Iteration `it` starts now (its deadline: the warm-up one or the measured one).
  void iteration(std::int64_t it);
  // The iteration that started last took `seconds` (feeds the median once warm-up is over).
  void iteration_done(double seconds);
  // An evaluation or checkpoint save starts now (deadline startup_s); `what` is a string literal.
  void slow_phase(const char* what, std::int64_t it);
  // No deadline until the next call above (after the loop).
  void idle();
  // The deadline in force for the next iteration, in seconds.
  double iteration_deadline() const;

 private:
  void arm(const char* what, std::int64_t it, double deadline);
  void watch();

  WatchdogOptions opt_;
  int rank_;
  std::vector<double> times_;  // iteration times after warm-up (the last 1000)
  std::int64_t timed_ = 0;     // iterations reported so far
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  const char* what_ = nullptr;  // nullptr: idle
  std::int64_t it_ = 0;
  double started_ = 0, deadline_ = 0;
  std::string basis_;
  std::thread thread_;
};

}  // namespace trident
