// Learning-rate schedule, Megatron's shapes: linear warm-up to lr over warmup_iters, then
// constant, linear or cosine decay to min_lr at decay_iters, min_lr afterwards.
// Iterations count from 1; iteration i uses lr(i) (so warm-up starts at lr/warmup, not 0).
#pragma once
#include <cstdint>
#include <string>

namespace trident {

struct LrSchedule {
  double lr = 1e-4, min_lr = 0.0;
  std::int64_t warmup_iters = 0, decay_iters = 0;
  std::string style = "cosine";  // constant | linear | cosine
  double at(std::int64_t iteration) const;
};

}  // namespace trident
