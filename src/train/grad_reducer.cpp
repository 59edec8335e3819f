// GradReducer (grad_reducer.hpp; docs/DESIGN.md "Data parallelism, gradient reduction and the
// optimizer"): the constructor collects each transformer layer's ranges of the flat gradient
// buffer (by ParamInfo::layer, tied copies left out) and merges touching ones; start() posts one
// non-blocking all-reduce per range, or with ZeRO-1 one reduce per piece to the rank owning its
// shard; reduce_rest() reduces the gaps between the ranges already done and the tail up to the
// padded size.
#include "train/grad_reducer.hpp"

#include <algorithm>

namespace trident {

GradReducer::GradReducer(const ParamStore& store, const Communicator& dp, std::int64_t shard)
    : store_(store), dp_(dp), shard_(shard) {
  // One bucket per global transformer layer, as each parameter recorded when its layer declared
  // it (ParamInfo::layer); the rest (embeddings, final LayerNorms, heads) goes in reduce_rest.
  for (const auto& p : store.params()) {
    if (p.tied_copy || p.layer < 0 || p.expert || p.state) continue;  // experts: reduced over their own group
    layer_ranges_[p.layer].push_back({p.offset, p.offset + p.numel()});
  }
  for (auto& [layer, ranges] : layer_ranges_) {  // merge touching ranges: fewer, larger messages
    std::sort(ranges.begin(), ranges.end());
    std::vector<Range> merged;  // sorted, touching ranges joined
    for (const Range& r : ranges) {
      if (!merged.empty() && merged.back().second == r.first)
        merged.back().second = r.second;
      else
        merged.push_back(r);
    }
    ranges = merged;
  }
}

void GradReducer::start(std::int64_t begin, std::int64_t end) {
  float* g = store_.grads().data();
  if (shard_ <= 0) {
    requests_.push_back(dp_.iallreduce_sum(g + begin, end - begin));
  } else {  // each piece to the DP rank whose shard holds it
    for (std::int64_t at = begin; at < end;) {
      const std::int64_t owner = at / shard_, stop = std::min(end, (owner + 1) * shard_);
      requests_.push_back(dp_.ireduce_sum(g + at, stop - at, static_cast<int>(owner)));
      at = stop;
    }
  }
  ++started_;
}

void GradReducer::layer_ready(std::int64_t layer) {
  auto it = layer_ranges_.find(layer);
  if (it == layer_ranges_.end()) return;
  for (const Range& r : it->second) {
    start(r.first, r.second);
    done_.push_back(r);
  }
}

void GradReducer::wait() { Communicator::wait_all(requests_); }

void GradReducer::reduce_rest() {
  wait();
  std::sort(done_.begin(), done_.end());
  std::int64_t at = 0;
  for (const Range& r : done_) {
    if (r.first > at) start(at, r.first);
    at = std::max(at, r.second);
  }
  if (store_.expert_begin() > at) start(at, store_.expert_begin());  // the dense range's end
  wait();
  done_.clear();
}

}  // namespace trident
