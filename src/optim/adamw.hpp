// AdamW over the flat parameter buffer (torch.optim.AdamW semantics: decoupled weight decay
// p *= 1 - lr*wd, bias-corrected moments). Weight decay applies to the prefix
// [0, decay_size) of the buffer (ParamStore puts decayed parameters first), none to biases and
// LayerNorm parameters. The gradient is multiplied by grad_scale on the fly (clipping).
#pragma once
#include <vector>

#include "common/half.hpp"
#include "common/types.hpp"

namespace trident {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// The optimizer owns the elements [begin, begin + n) of the flat buffers: all of them, or with
// the distributed optimizer (ZeRO-1) this data-parallel rank's shard, whose moments are the
// only ones it stores. A model with MoE experts has two such segments: the dense parameters'
// (sharded over the data-parallel group) and the experts' (sharded over the expert-data-parallel
// group), each with its own weight-decay prefix.
class AdamW {
 public:
  struct Segment {
    std::int64_t begin = 0, n = 0;  // the flat buffers' elements [begin, begin + n)
    std::int64_t decay_end = 0;     // weight decay on the flat indices below (from the region's start)
    bool expert = false;            // the experts' region (ParamStore::expert_begin())
    std::int64_t at = 0;            // where its state starts in exp_avg() etc. (set by the constructor)
  };
  AdamW(const AdamWConfig& cfg, std::int64_t n, std::int64_t decay_size, std::int64_t begin = 0);
  AdamW(const AdamWConfig& cfg, std::vector<Segment> segments);
  const std::vector<Segment>& segments() const { return seg_; }
  // One step (step counter incremented inside) with learning rate lr over params[begin, begin+n)
  // from grads[begin, begin+n) (full-size flat buffers). GradsAfter::zero also sets those
  // gradients to zero in the same sweep over memory (the next iteration's zeroing of that range,
  // at no extra pass: ParamStore::zero_grads then skips it).
  enum class GradsAfter { keep, zero };
  void step(const FloatView& params, const FloatView& grads, double lr, float grad_scale,
            GradsAfter after = GradsAfter::keep);

  // Mixed precision (Megatron's Float16Optimizer): fp32 master weights for [begin, begin + n)
  // initialised from the 16-bit model (`model16`, full flat buffer); step_mixed updates the
  // masters from the fp32 main gradients and writes them, rounded to nearest even, into the
  // model's 16-bit words.
  void init_master(DType dt, const HalfView& model16);
  void step_mixed(const HalfView& model16, const FloatView& grads, double lr, float grad_scale,
                  GradsAfter after = GradsAfter::keep);
  bool has_master() const { return master_.extent(0) > 0; }
  // (size()): segment after segment, element seg.at + i is flat index seg.begin + i
  const FloatView& master() const { return master_; }

  // Whether this build's update rounds b1 * m + (1 - b1) * g and b2 * v + (1 - b2) * g^2 once
  // (fused multiply-add, common/device_math.hpp dfma) or twice; every other operation rounds once.
  static bool fuses_multiply_add();

  std::int64_t steps() const { return step_; }
  void set_steps(std::int64_t s) { step_ = s; }
  std::int64_t size() const { return n_; }            // elements over all segments
  const FloatView& exp_avg() const { return m_; }     // (size()), laid out as master()
  const FloatView& exp_avg_sq() const { return v_; }  // (size()), laid out as master()
  std::int64_t state_bytes() const { return (has_master() ? 3 : 2) * n_ * static_cast<std::int64_t>(sizeof(float)); }

 private:
  AdamWConfig cfg_;
  std::vector<Segment> seg_;
  std::int64_t n_ = 0, step_ = 0;
  FloatView m_, v_, master_;  // (n) each: exp_avg, exp_avg_sq, fp32 masters (empty without init_master)
  DType dt_ = DType::F32;
  template <class Out>
  void update(const Segment& s, float* p, float* g, Out out, double lr, float grad_scale, GradsAfter after);
};

// Global L2 norm of the gradient, squared: the sum of squares of grads[0, n) (this rank's
// buffer; caller reduces across model-parallel groups when they exist).
double grad_norm_squared(const FloatView& grads, std::int64_t n);

}  // namespace trident
