// Pipeline schedules: the order in which one stage runs the forward (F) and backward (B)
// passes of the micro-batches of an iteration.
//   no pipelining (pp = 1): F0 B0 F1 B1 ...
//   1F1B (PipeDream-Flush, Megatron's default): stage s runs min(pp - s - 1, m) warm-up
//   forwards, then alternates one forward and one backward, then drains the remaining
//   backwards. At most pp - s micro-batches are in flight on stage s.
//   interleaved 1F1B with vp virtual stages per rank (below): the bubble shrinks by vp.
// Also the layer split over stages (Megatron's even split, optionally with the first and last
// stage's layer counts given).
#pragma once
#include <cstdint>
#include <vector>

namespace trident {

struct PipelineOp {
  bool forward;
  int micro;
  int chunk = 0;  // model chunk (virtual stage chunk * stages + stage) for the interleaved schedule
};

std::vector<PipelineOp> schedule_1f1b(int stages, int stage, int micro_batches);

// Interleaved 1F1B (Megatron's virtual pipeline): each rank holds vp model chunks; chunk c of
// stage s is virtual stage c * stages + s. Forward op k runs chunk (k mod (stages*vp)) / stages
// on micro-batch (k / (stages*vp)) * stages + k mod stages; backward ops visit the chunks in
// reverse. Warm-up: (stages - s - 1) * 2 + (vp - 1) * stages forwards (all of them when
// micro_batches == stages). Needs micro_batches % stages == 0 (Error::all otherwise).
std::vector<PipelineOp> schedule_interleaved(int stages, int stage, int micro_batches, int vp);
// The most micro-batches one model chunk holds activations for under a schedule.
int max_in_flight(const std::vector<PipelineOp>& ops, int chunks);

// First layer and layer count of each stage. first/last: layers on the first and last stage
// (0: even split). Throws Error::all naming the deck keys when the layers do not divide.
std::vector<std::pair<std::int64_t, std::int64_t>> split_layers(std::int64_t layers, int stages, std::int64_t first,
                                                               std::int64_t last);

}  // namespace trident
