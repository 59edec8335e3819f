// Wall-clock timers: wall_seconds() (steady clock) and PhaseTimers, named timers whose
// start/stop intervals add up per name. start and stop record marks in the device's queue
// (common/stream_mark.hpp) rather than waiting for the device, so a timer inside the training step
// adds no wait: start() adds up the intervals the device has passed, and totals() the rest,
// waiting for them (the end-of-run report).
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/stream_mark.hpp"

namespace trident {

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Named accumulating timers: timers.start("fwd-bwd"); ...; timers.stop("fwd-bwd");
class PhaseTimers {
 public:
  void start(const std::string& name) {
    add_passed();
    open_[name] = StreamMark::record();
  }
  void stop(const std::string& name) { pending_.emplace_back(name, std::make_pair(open_[name], StreamMark::record())); }
  const std::map<std::string, double>& totals() const {
    add_passed();
    for (const auto& [name, marks] : pending_) total_[name] += StreamMark::seconds(marks.first, marks.second);
    pending_.clear();
    return total_;
  }
  void reset() {
    total_.clear();
    pending_.clear();
  }

 private:
  // the pending intervals whose end the device has passed (in order: they end in order)
  void add_passed() const {
    std::size_t n = 0;
    while (n < pending_.size() && pending_[n].second.second.passed()) {
      const auto& [name, marks] = pending_[n];
      total_[name] += StreamMark::elapsed(marks.first, marks.second);
      ++n;
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  std::map<std::string, StreamMark> open_;
  mutable std::vector<std::pair<std::string, std::pair<StreamMark, StreamMark>>> pending_;
  mutable std::map<std::string, double> total_;
};

}  // namespace trident
