// The watchdog thread (watchdog.hpp; docs/DESIGN.md "During the run"). The main thread arms each
// phase with its start and deadline: startup_s for warm-up iterations, evaluations and saves,
// otherwise max(min_s, factor x the median of the last 1000 iteration times), or min_s when the
// factor is 0. The thread waits on a condition variable, at most 1 s at a time; past the deadline
// it writes one line naming the phase and the communication call in progress (common/progress)
// and calls MPI_Abort with kExitWatchdog, with std::_Exit 20 s later should the abort not return
// (docs/DESIGN.md "Exit codes").
#include "train/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/mpi_job.hpp"
#include "common/progress.hpp"

namespace trident {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Watchdog::Watchdog(const WatchdogOptions& options, int world_rank) : opt_(options), rank_(world_rank) {
  if (opt_.enable) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

double Watchdog::iteration_deadline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (timed_ < opt_.warmup_iters || times_.empty() || opt_.factor == 0)
    return timed_ < opt_.warmup_iters ? opt_.startup_s : opt_.min_s;
  std::vector<double> t = times_;  // a copy: nth_element reorders it
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return std::max(opt_.min_s, opt_.factor * t[t.size() / 2]);
}

void Watchdog::arm(const char* what, std::int64_t it, double deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = what;
    it_ = it;
    started_ = now();
    deadline_ = deadline;
  }
  wake_.notify_all();
}

void Watchdog::iteration(std::int64_t it) {
  const double d = iteration_deadline();
  std::string basis;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    char buf[160];
    if (timed_ < opt_.warmup_iters)
      std::snprintf(buf, sizeof buf, "watchdog.startup_s during the first %lld iterations",
                    static_cast<long long>(opt_.warmup_iters));
    else if (opt_.factor == 0)
      std::snprintf(buf, sizeof buf, "watchdog.min_s");
    else
      std::snprintf(buf, sizeof buf, "%g x the median iteration time, at least watchdog.min_s = %g s", opt_.factor,
                    opt_.min_s);
    basis_ = buf;
  }
  progress::set_phase("iteration");
  arm("iteration", it, d);
}

void Watchdog::iteration_done(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (timed_++ < opt_.warmup_iters) return;
  if (times_.size() == 1000) times_.erase(times_.begin());
  times_.push_back(seconds);
}

void Watchdog::slow_phase(const char* what, std::int64_t it) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    basis_ = "watchdog.startup_s";
  }
  progress::set_phase(what);
  arm(what, it, opt_.startup_s);
}

void Watchdog::idle() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = nullptr;
  }
  progress::set_phase("outside the training loop");
  wake_.notify_all();
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (!what_) {
      wake_.wait(lock);
      continue;
    }
    const double left = started_ + deadline_ - now();
    if (left > 0) {
      // wake up at the deadline, or earlier when the phase changes
      wake_.wait_for(lock, std::chrono::duration<double>(std::min(left, 1.0)));
      continue;
    }
    // Past the deadline: report where this rank is and end the whole job. The message goes out
    // with one write so that the ranks' lines do not interleave.
    char head[512];
    const bool iteration = std::string(what_) == "iteration";
    std::snprintf(head, sizeof head, "watchdog (rank %d): %s%s %lld has run %.1f s, past its deadline of %.1f s (%s); ",
                  rank_, iteration ? "" : what_, iteration ? "iteration" : " at iteration", static_cast<long long>(it_),
                  now() - started_, deadline_, basis_.c_str());
    const std::string msg = std::string(head) + progress::describe() + "; ending the job with exit code " +
                            std::to_string(kExitWatchdog) + " (resubmit: checkpoint.load auto resumes)\n";
    std::fwrite(msg.data(), 1, msg.size(), stderr);
    std::fflush(stderr);
    lock.unlock();
    // MPI_Abort from this thread while the main thread is blocked in MPI: MPICH's abort asks the
    // process manager to kill the job. Should it not return promptly, leave regardless.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(20));
      std::_Exit(kExitWatchdog);
    }).detach();
    mpi_job::abort_job(kExitWatchdog);
  }
}

}  // namespace trident
