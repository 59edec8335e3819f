// Wall-clock timers: wall_seconds() (steady clock) and PhaseTimers, named timers whose
// start/stop intervals add up per name. stop() fences Kokkos first so device work is counted
// where it ran.
#pragma once
#include <Kokkos_Core.hpp>
#include <chrono>
#include <map>
#include <string>

namespace trident {

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Named accumulating timers: timers.start("fwd-bwd"); ...; timers.stop("fwd-bwd");
class PhaseTimers {
 public:
  void start(const std::string& name) { open_[name] = wall_seconds(); }
  void stop(const std::string& name) {
    Kokkos::fence();
    total_[name] += wall_seconds() - open_[name];
  }
  const std::map<std::string, double>& totals() const { return total_; }
  void reset() { total_.clear(); }

 private:
  std::map<std::string, double> open_, total_;
};

}  // namespace trident
