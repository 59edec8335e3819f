// Progress record for the watchdog (progress.hpp): the phase and the current communication call
// (op, group, size, peer, start time) live in process-wide atomics; InComm saves and restores
// the enclosing call, so nested calls unwind correctly; describe() formats them for the report.
#include "common/progress.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>

namespace trident::progress {

namespace {
std::atomic<const char*> g_phase{"start-up"};
std::atomic<const char*> g_op{nullptr};
std::atomic<const char*> g_group{""};
std::atomic<int> g_size{0}, g_peer{-1};
std::atomic<double> g_since{0.0};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void set_phase(const char* phase) { g_phase = phase; }

InComm::InComm(const char* op, const char* group, int group_size, int peer)
    : op_(g_op.load()), group_(g_group.load()), size_(g_size.load()), peer_(g_peer.load()), since_(g_since.load()) {
  g_group = group;
  g_size = group_size;
  g_peer = peer;
  g_since = now();
  g_op = op;  // last: a reader that sees the op sees its details (or the next call's)
}

InComm::~InComm() {
  g_op = op_;  // restores the enclosing call (nullptr when none)
  g_group = group_;
  g_size = size_;
  g_peer = peer_;
  g_since = since_;
}

std::string describe() {
  std::string out = std::string("phase '") + g_phase.load() + "', ";
  const char* op = g_op.load();
  if (!op) return out + "not in a communication call";
  char buf[320];
  const int peer = g_peer.load(), size = g_size.load();
  std::string group = std::string(" on the ") + g_group.load() + " group";
  if (size > 0) group += " (" + std::to_string(size) + " ranks" + (peer >= 0 ? ", peer rank " + std::to_string(peer) : "") + ")";
  if (size <= 0) group = std::string(" of the ") + g_group.load() + " requests";
  std::snprintf(buf, sizeof buf, "in %s%s for %.1f s", op, group.c_str(), now() - g_since.load());
  return out + buf;
}

}  // namespace trident::progress
