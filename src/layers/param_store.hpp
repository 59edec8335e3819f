// ParamStore: every parameter of a model lives in one flat, contiguous buffer (and its gradient
// in a second one of the same layout), so that data-parallel reduction, clipping and the
// optimizer each run as one kernel or one collective over the whole model.
//
// A parameter knows its checkpoint name, the GLOBAL shape stored in checkpoints, and which
// slice of it this rank holds (offsets, and how many local rows/columns are real rather than
// padding), so checkpoints are written global and load under any layout.
// Layout of the flat buffer, four groups in this order:
//   [decay, TP-sharded][decay, TP-replicated][no decay, TP-replicated][no decay, TP-sharded]
// preceded, in a model with LoRA adapters, by the adapters ([TP-sharded][TP-replicated], padded
// like the whole buffer): then only that range [0, trainable_size()) trains, and the optimizer,
// the gradient reductions and the distributed optimizer's shards cover it alone.
// so that weight decay applies to the prefix [0, decay_size()) and the parameters replicated
// over the tensor-parallel group (LayerNorm, row-parallel biases, position embeddings) form one
// contiguous range (their gradients are all-reduced over TP under sequence parallelism, and
// counted once in the global gradient norm).
#pragma once
#include <string>
#include <vector>

#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

struct ParamInfo {
  std::string name;                 // e.g. "model/layers/0/mlp/fc1/weight"
  std::vector<std::int64_t> shape;  // local shape (1-D or 2-D), row-major
  std::vector<std::int64_t> global_shape;
  std::vector<std::int64_t> global_offset;  // start of the local slice in the global tensor
  std::vector<std::int64_t> valid;          // local extent that maps onto the global tensor (rest: padding)
  // The row dimension consists of row_blocks equal blocks, each sharded alike (fused q | kv,
  // gate | up). global_offset[0] and valid[0] are then per block.
  std::int64_t row_blocks = 1;
  // Where the row blocks sit: this rank's rows local0.. of the local tensor are the global rows
  // global0.., `rows` of them. Blocks of unequal sizes (grouped-query attention's q | k | v) are
  // declared here; left empty, declare() fills it with the row_blocks equal blocks above.
  struct RowBlock {
    std::int64_t local0 = 0, global0 = 0, rows = 0;
  };
  std::vector<RowBlock> blocks;
  bool tp_replicated = true;  // every TP rank holds the same full tensor
  // Replicated over TP, but each rank's gradient is a partial sum over TP even without sequence
  // parallelism (the q/k norms: each rank normalises its own heads); all-reduced over TP.
  bool tp_partial_grad = false;
  // A copy of a parameter owned by another pipeline stage (the last stage's tied word
  // embeddings): loaded from checkpoints, never written, left out of the gradient norm.
  bool tied_copy = false;
  bool weight_decay = false;
  // A LoRA adapter (A or B of a projection): trained while the rest of the model is frozen.
  bool adapter = false;
  // A parameter of one MoE expert (docs/DESIGN.md "Mixture of experts"): it lives in the expert
  // range of the flat buffers, its gradient is summed over the expert-data-parallel group (not
  // over TP and DP), and the ep ranks of an expert-parallel group hold other experts alike.
  bool expert = false;
  // Model state that is not trained (an MoE router's expert bias): fp32 whatever the parameters'
  // type, outside the flat buffers (no gradient, no optimizer state), checkpointed by name as
  // the parameters are. Its offset is into the host copies of model_to_host(): after the
  // padded flat buffer.
  bool state = false;
  float init_std = 0.f;  // normal(0, init_std); 0 means constant init_value
  float init_value = 0.f;
  std::int64_t offset = -1;  // into the flat buffers, set by allocate()
  // The global transformer layer that declared it (ParamStore::LayerScope), -1 for the
  // embeddings, final LayerNorms and heads: what the overlapped gradient reduction buckets by.
  std::int64_t layer = -1;
  std::int64_t numel() const;
};

using ParamId = int;

class ParamStore {
 public:
  // A parameter whose local shape is its global shape (no sharding, no padding).
  ParamId declare(const std::string& name, std::vector<std::int64_t> shape, bool weight_decay, float init_std,
                  float init_value = 0.f);
  ParamId declare(ParamInfo info);
  // A state (ParamInfo::state): declared like a parameter, read and written with state().
  ParamId declare_state(ParamInfo info);
  FloatView state(ParamId id) const;  // (numel) fp32, in the default memory space
  bool has_states() const { return states_.extent(0) > 0; }
  const FloatView& states() const { return states_; }  // (host_size() - padded_size())
  // While a LayerScope lives, declared parameters belong to global transformer layer `layer`.
  class LayerScope {
   public:
    LayerScope(ParamStore& store, std::int64_t layer) : store_(store), outer_(store.layer_) { store.layer_ = layer; }
    ~LayerScope() { store_.layer_ = outer_; }
    LayerScope(const LayerScope&) = delete;
    LayerScope& operator=(const LayerScope&) = delete;

   private:
    ParamStore& store_;
    std::int64_t outer_;
  };
  // The type of the model's parameters: fp32, or bf16 / fp16 words (mixed precision: the fp32
  // master copy then lives in the optimizer). Set before allocate().
  void set_dtype(DType dt);
  DType dtype() const { return dtype_; }
  // Allocates the flat buffers, padded with zeros to a multiple of `multiple` elements (the
  // distributed optimizer splits them into equal data-parallel shards). The experts' parameters
  // (ParamInfo::expert) follow as a range of their own, [expert_begin(), padded_size()): those
  // with weight decay first, padded to a multiple of `expert_multiple` (the expert-data-parallel
  // shards).
  void allocate(std::int64_t multiple = 1, std::int64_t expert_multiple = 1);
  // The expert range and its weight-decay prefix [expert_begin(), expert_decay_end()); the dense
  // parameters are [0, expert_begin()) (padded), which is all of the buffer without experts.
  std::int64_t expert_begin() const { return expert_begin_; }
  std::int64_t expert_decay_end() const { return expert_decay_end_; }
  bool has_experts() const { return padded_size() > expert_begin_; }
  // The dense part of the trainable range: [0, dense_trainable_size()) (the adapters with LoRA).
  std::int64_t dense_trainable_size() const { return has_adapters() ? adapter_padded_ : expert_begin_; }
  // The expert-parallel size: every expert parameter counts ep times in global_count() (the other
  // ranks of its expert-parallel group hold as many other experts). Before allocate().
  void set_expert_parallel(std::int64_t ep) { ep_ = ep; }
  bool allocated() const { return padded_size() > 0 || total_ == 0; }

  FloatView value(ParamId id) const;   // fp32 parameters only
  HalfView value16(ParamId id) const;  // 16-bit parameters only
  Act param(ParamId id) const;         // either
  FloatView grad(ParamId id) const;
  const ParamInfo& info(ParamId id) const { return params_.at(id); }
  const std::vector<ParamInfo>& params() const { return params_; }
  const FloatView& values() const { return values_; }     // fp32 model (empty with 16-bit parameters)
  const HalfView& values16() const { return values16_; }  // 16-bit model (empty with fp32 parameters)
  // The model's parameters as fp32 on the host (widened from 16 bits), and back (rounded to
  // nearest even into 16 bits); followed by the states (host_size() values in all).
  HostFloatView model_to_host() const;
  void model_from_host(const HostFloatView& host);
  std::int64_t host_size() const { return padded_size() + static_cast<std::int64_t>(states_.extent(0)); }
  std::int64_t model_bytes() const { return padded_size() * dtype_bytes(dtype_); }
  const FloatView& grads() const { return grads_; }
  std::int64_t size() const { return total_; }
  std::int64_t padded_size() const { return static_cast<std::int64_t>(grads_.extent(0)); }
  std::int64_t decay_size() const { return decay_total_; }
  // [begin, end) of the TP-replicated parameters in the flat buffers.
  std::int64_t replicated_begin() const { return replicated_begin_; }
  std::int64_t replicated_end() const { return replicated_end_; }
  // [tp_partial_begin(), replicated_end()): the replicated parameters with tp_partial_grad (the
  // end of the replicated range; empty without them)
  std::int64_t tp_partial_begin() const { return tp_partial_begin_; }
  // Before allocate(): marks every parameter whose name starts with `prefix` tp_partial_grad.
  void mark_tp_partial_grad(const std::string& prefix);
  // LoRA: whether adapters were declared (the base model is then frozen), and the trainable
  // range [0, trainable_size()) of the flat buffers (the whole padded buffer without adapters).
  // The adapters replicated over TP (column-parallel A, row-parallel B) lie in
  // [adapter_replicated_begin(), adapter_replicated_end()); every TP rank's gradient of them is a
  // partial sum, all-reduced over TP.
  bool has_adapters() const { return adapter_total_ > 0; }
  std::int64_t trainable_size() const { return has_adapters() ? adapter_padded_ : padded_size(); }
  std::int64_t adapter_replicated_begin() const { return adapter_replicated_begin_; }
  std::int64_t adapter_replicated_end() const { return adapter_total_; }
  // Whether parameter id is trained (everything without adapters; only the adapters with them).
  bool trains(ParamId id) const { return !has_adapters() || params_.at(id).adapter; }
  // Number of parameters counted globally (sum of global shapes, no padding); of the adapters only.
  std::int64_t global_count() const;
  std::int64_t global_adapter_count() const;
  ParamId find(const std::string& name) const;  // -1 when absent

  // Sets the gradients to zero, except [keep_begin, keep_end), a range the caller knows to be
  // zero already (the optimizer's, which AdamW::GradsAfter::zero cleared in its update).
  void zero_grads(std::int64_t keep_begin = 0, std::int64_t keep_end = 0);
  // Deterministic init, independent of the parallel layout: each parameter's GLOBAL tensor is
  // drawn from a stream seeded by (seed, name), and this rank keeps its slice.
  void initialize(std::uint64_t seed);

 private:
  std::vector<ParamInfo> params_;
  DType dtype_ = DType::F32;
  FloatView values_, grads_;
  HalfView values16_;
  FloatView states_;  // the states, in declaration order
  std::int64_t total_ = 0, decay_total_ = 0, replicated_begin_ = 0, replicated_end_ = 0, tp_partial_begin_ = 0;
  std::int64_t adapter_total_ = 0, adapter_padded_ = 0, adapter_replicated_begin_ = 0;
  std::int64_t expert_begin_ = 0, expert_decay_end_ = 0, ep_ = 1;
  std::int64_t layer_ = -1;  // the open LayerScope's layer
};

}  // namespace trident
