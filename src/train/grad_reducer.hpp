// Data-parallel gradient reduction in buckets overlapped with the backward pass (Megatron's
// --overlap-grad-reduce). A bucket is one transformer layer's parameters: as soon as the last
// micro-batch's backward pass has finished a layer (LanguageModel::on_layer_grads_ready), its
// contiguous ranges of the flat gradient buffer are all-reduced over the data-parallel group
// without blocking (MPI_Iallreduce; NCCL on the device stream in CUDA builds), while the
// earlier layers still run backward. After the backward pass, wait() completes them and
// reduce_rest() reduces everything no bucket covered (embeddings, final LayerNorm, padding).
// With the distributed optimizer (shard > 0: DP rank r owns [r * shard, (r + 1) * shard)) each
// piece of a bucket is reduced only to the rank whose shard holds it (non-blocking reduces),
// which leaves every rank what the reduce-scatter would: the sum over ranks of its shard.
#pragma once
#include <map>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "layers/param_store.hpp"

namespace trident {

class GradReducer {
 public:
  GradReducer(const ParamStore& store, const Communicator& dp, std::int64_t shard = 0);
  void layer_ready(std::int64_t layer);  // starts that layer's buckets
  void wait();                           // completes the started buckets
  void reduce_rest();                    // reduces what no bucket covered; next iteration starts clean
  std::int64_t buckets_started() const { return started_; }

 private:
  using Range = std::pair<std::int64_t, std::int64_t>;  // [begin, end) of the flat buffer
  const ParamStore& store_;
  const Communicator& dp_;
  std::map<std::int64_t, std::vector<Range>> layer_ranges_;
  std::vector<Range> done_;
  std::vector<MPI_Request> requests_;
  std::int64_t started_ = 0, shard_ = 0;
  void start(std::int64_t begin, std::int64_t end);  // one range, non-blocking
};

}  // namespace trident
