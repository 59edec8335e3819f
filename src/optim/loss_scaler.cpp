// Loss scaler (Megatron semantics; rules in loss_scaler.hpp): the constant scaler only counts
// skipped steps; the dynamic one resets the growth window and spends one unit of hysteresis on
// every overflow (backing off, never below min_scale, once the budget is spent) and grows the
// scale after `window` clean steps in a row. restore() reloads the state from a checkpoint.
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
