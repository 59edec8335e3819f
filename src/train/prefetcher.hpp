// Overlap of data loading with compute: while micro-batch k runs forward and backward, a helper
// thread reads micro-batch k+1's token windows from the shards (HDF5 hyperslab reads, the
// dataset's index look-ups). Only that thread touches the dataset and HDF5 while an iteration
// computes (checkpoints and evaluations run between iterations, after it has finished), so no
// thread-safe HDF5 build is needed. Errors raised while loading surface in the main thread, at
// the micro-batch that needs the data.
#pragma once
#include <cstdint>
#include <functional>
#include <future>
#include <vector>

namespace trident {

class Prefetcher {
 public:
  // fill(k, windows): writes micro-batch k's windows into `windows` (already sized).
  using Fill = std::function<void(std::int64_t, std::vector<std::int32_t>&)>;
  Prefetcher(Fill fill, std::size_t window_values, bool enabled);
  ~Prefetcher();
  // Micro-batch k's windows (waiting for the helper when it is preparing them); then starts
  // micro-batch k + 1 when k + 1 < m. The reference stays valid until the next call.
  const std::vector<std::int32_t>& get(std::int64_t k, std::int64_t m);
  // Waits for any outstanding load (end of an iteration).
  void drain();
  bool enabled() const { return enabled_; }

 private:
  Fill fill_;
  bool enabled_;
  std::vector<std::int32_t> buf_[2];
  std::future<void> pending_;
  std::int64_t pending_k_ = -1;
};

}  // namespace trident
