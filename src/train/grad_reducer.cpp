// Bucketed, overlapped data-parallel gradient reduction.
#include "train/grad_reducer.hpp"

#include <algorithm>
#include <string>

namespace trident {

GradReducer::GradReducer(const ParamStore& store, const Communicator& dp) : store_(store), dp_(dp) {
  const std::string prefix = "model/layers/";
  for (const auto& p : store.params()) {
    if (p.name.compare(0, prefix.size(), prefix) != 0 || p.tied_copy) continue;
    const std::int64_t layer = std::stoll(p.name.substr(prefix.size()));
    layer_ranges_[layer].push_back({p.offset, p.offset + p.numel()});
  }
  for (auto& [layer, ranges] : layer_ranges_) {  // merge touching ranges: fewer, larger messages
    std::sort(ranges.begin(), ranges.end());
    std::vector<Range> merged;
    for (const Range& r : ranges) {
      if (!merged.empty() && merged.back().second == r.first)
        merged.back().second = r.second;
      else
        merged.push_back(r);
    }
    ranges = merged;
  }
}

void GradReducer::layer_ready(std::int64_t layer) {
  auto it = layer_ranges_.find(layer);
  if (it == layer_ranges_.end()) return;
  float* g = store_.grads().data();
  for (const Range& r : it->second) {
    requests_.push_back(dp_.iallreduce_sum(g + r.first, r.second - r.first));
    done_.push_back(r);
    ++started_;
  }
}

void GradReducer::wait() { Communicator::wait_all(requests_); }

void GradReducer::reduce_rest() {
  wait();
  std::sort(done_.begin(), done_.end());
  float* g = store_.grads().data();
  std::int64_t at = 0;
  for (const Range& r : done_) {
    if (r.first > at) dp_.allreduce_sum(g + at, r.first - at);
    at = std::max(at, r.second);
  }
  if (store_.padded_size() > at) dp_.allreduce_sum(g + at, store_.padded_size() - at);
  done_.clear();
}

}  // namespace trident
