// LR schedule (LrSchedule::at; shapes in lr_schedule.hpp): linear warm-up over iterations
// 1..warmup_iters, then constant lr, or the linear or cosine (0.5 (1 + cos(pi r))) decay from lr
// to min_lr over (warmup_iters, decay_iters], and min_lr after decay_iters.
#include "optim/lr_schedule.hpp"

#include <cmath>

namespace trident {

double LrSchedule::at(std::int64_t i) const {
  if (warmup_iters > 0 && i <= warmup_iters) return lr * static_cast<double>(i) / static_cast<double>(warmup_iters);
  if (style == "constant") return lr;
  if (i > decay_iters || decay_iters <= warmup_iters) return min_lr;
  const double r = static_cast<double>(i - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  const double coeff = style == "linear" ? 1.0 - r : 0.5 * (1.0 + std::cos(M_PI * r));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace trident
