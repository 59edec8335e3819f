// Loss scaling for fp16 training (Megatron's ConstantGradScaler / DynamicGradScaler).
// The loss gradient is multiplied by scale() before the backward pass; the main gradients are
// unscaled (multiplied by 1/scale) before clipping and the optimizer. update(found_inf) is
// called once per iteration with the overflow flag agreed by every rank (a max over the world):
//   overflow: the step is skipped; after `hysteresis` consecutive overflowing steps the scale is
//             multiplied by backoff (0.5), never below min_scale;
//   clean:    after `window` consecutive clean steps the scale is multiplied by growth (2) and
//             the hysteresis budget is restored.
#pragma once
#include <cstdint>

namespace trident {

struct LossScalerConfig {
  double initial = 4294967296.0;  // 2^32
  double min_scale = 1.0;
  double growth = 2.0, backoff = 0.5;
  std::int64_t window = 1000, hysteresis = 2;
  bool dynamic = true;  // false: a constant scale (initial)
};

class LossScaler {
 public:
  LossScaler() = default;
  explicit LossScaler(const LossScalerConfig& c);
  double scale() const { return scale_; }
  // Returns true when the step must be skipped (found_inf).
  bool update(bool found_inf);
  std::int64_t skipped() const { return skipped_; }
  // State kept in checkpoints.
  std::int64_t growth_tracker() const { return growth_tracker_; }
  std::int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  void restore(double scale, std::int64_t growth_tracker, std::int64_t hysteresis_tracker, std::int64_t skipped);

 private:
  LossScalerConfig c_;
  double scale_ = 1.0;
  std::int64_t growth_tracker_ = 0, hysteresis_tracker_ = 1, skipped_ = 0;
};

}  // namespace trident
