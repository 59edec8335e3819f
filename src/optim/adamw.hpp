// AdamW over the flat parameter buffer (torch.optim.AdamW semantics: decoupled weight decay
// p *= 1 - lr*wd, bias-corrected moments). Weight decay applies to the prefix
// [0, decay_size) of the buffer (ParamStore puts decayed parameters first), none to biases and
// LayerNorm parameters. The gradient is multiplied by grad_scale on the fly (clipping).
#pragma once
#include "common/types.hpp"

namespace trident {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// The optimizer owns the elements [begin, begin + n) of the flat buffers: all of them, or with
// the distributed optimizer (ZeRO-1) this data-parallel rank's shard, whose moments are the
// only ones it stores.
class AdamW {
 public:
  AdamW(const AdamWConfig& cfg, std::int64_t n, std::int64_t decay_size, std::int64_t begin = 0);
  // One step (step counter incremented inside) with learning rate lr over params[begin, begin+n)
  // from grads[begin, begin+n) (full-size flat buffers).
  void step(const FloatView& params, const FloatView& grads, double lr, float grad_scale);

  std::int64_t steps() const { return step_; }
  void set_steps(std::int64_t s) { step_ = s; }
  std::int64_t begin() const { return begin_; }
  std::int64_t size() const { return n_; }
  const FloatView& exp_avg() const { return m_; }       // (n): element i is flat index begin + i
  const FloatView& exp_avg_sq() const { return v_; }
  std::int64_t state_bytes() const { return 2 * n_ * static_cast<std::int64_t>(sizeof(float)); }

 private:
  AdamWConfig cfg_;
  std::int64_t n_, decay_size_, begin_, step_ = 0;
  FloatView m_, v_;
};

// Global L2 norm of the gradient (this rank's buffer; caller reduces across model-parallel
// groups when they exist).
double grad_norm_squared(const FloatView& grads, std::int64_t n);

}  // namespace trident
