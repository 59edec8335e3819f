// Prefetcher (prefetcher.hpp; data.prefetch in docs/DESIGN.md "Data flow"): two record buffers
// used by micro-batch parity. get(k) waits for k's std::async load when one is pending
// (rethrowing its error in the main thread) or fills it here, then starts loading k + 1 into the
// other buffer when prefetching is on and k + 1 < m.
#include "train/prefetcher.hpp"

namespace trident {

Prefetcher::Prefetcher(Fill fill, std::size_t window_values, bool enabled) : fill_(std::move(fill)), enabled_(enabled) {
  buf_[0].resize(window_values);
  buf_[1].resize(window_values);
}

Prefetcher::~Prefetcher() {
  if (pending_.valid()) pending_.wait();
}

void Prefetcher::drain() {
  if (pending_.valid()) pending_.get();  // rethrows a loading error
  pending_k_ = -1;
}

const std::vector<std::int32_t>& Prefetcher::get(std::int64_t k, std::int64_t m) {
  std::vector<std::int32_t>& mine = buf_[k % 2];  // (window_values): micro-batch k's records
  if (pending_k_ == k) {
    pending_.get();  // rethrows a loading error here, in the main thread
    pending_k_ = -1;
  } else {
    drain();
    fill_(k, mine);
  }
  if (enabled_ && k + 1 < m) {
    std::vector<std::int32_t>* next = &buf_[(k + 1) % 2];
    pending_k_ = k + 1;
    pending_ = std::async(std::launch::async, [this, k, next] { fill_(k + 1, *next); });
  }
  return mine;
}

}  // namespace trident
