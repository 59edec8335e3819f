// Loss scaler (Megatron semantics).
#include "optim/loss_scaler.hpp"

#include <algorithm>

namespace trident {

LossScaler::LossScaler(const LossScalerConfig& c)
    : c_(c), scale_(c.initial), growth_tracker_(0), hysteresis_tracker_(c.hysteresis), skipped_(0) {}

bool LossScaler::update(bool found_inf) {
  if (!c_.dynamic) {
    if (found_inf) ++skipped_;
    return found_inf;
  }
  if (found_inf) {
    ++skipped_;
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * c_.backoff, c_.min_scale);
    return true;
  }
  ++growth_tracker_;
  if (growth_tracker_ == c_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = c_.hysteresis;
    scale_ *= c_.growth;
  }
  return false;
}

void LossScaler::restore(double scale, std::int64_t growth_tracker, std::int64_t hysteresis_tracker,
                         std::int64_t skipped) {
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  hysteresis_tracker_ = hysteresis_tracker;
  skipped_ = skipped;
}

}  // namespace trident
