// What this rank is doing now, for the watchdog's report (train/watchdog.hpp): the training loop
// names its phase, and every blocking collective of comm/ marks itself while it runs. Written by
// the main thread, read by the watchdog's thread (lock-free atomics of string literals and ints).
#pragma once
#include <string>

namespace trident::progress {

// The phase of the training loop ("forward-backward", "grad-allreduce", "optimizer", ...): a
// string with static storage duration.
void set_phase(const char* phase);

// Marks a blocking communication call for its lifetime: op and group must outlive it. peer: the
// first peer of a point-to-point group (-1 for collectives).
class InComm {
 public:
  InComm(const char* op, const char* group, int group_size, int peer = -1);
  ~InComm();
  InComm(const InComm&) = delete;
  InComm& operator=(const InComm&) = delete;

 private:
  const char *op_, *group_;
  int size_, peer_;
  double since_;
};

// "phase 'optimizer', in allreduce on the dp group (2 ranks) for 12.3 s" or "phase 'optimizer',
// not in a communication call".
std::string describe();

}  // namespace trident::progress
