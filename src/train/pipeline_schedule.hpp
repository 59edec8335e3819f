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
#include <functional>
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

// Lock-step message plan, for point-to-point in groups (NCCL's ncclGroupStart/ncclSend/ncclRecv,
// or MPI's Isend/Irecv + Waitall). Every stage runs its op list; at global step t each stage
// runs its next op if the op's input arrived by step t - 1, and every message produced at step t
// travels in group t: the sender posts it in its group t and the receiver in its group t. As
// the groups of all stages are matched index by index, no schedule can deadlock (group t of a
// stage waits only on its neighbours' group t, and they reach it after groups < t), and the
// messages between two stages are posted in the same order on both sides (NCCL has no tags).
// A message that arrives before its op runs waits in a receive buffer of a per-stage pool.
struct P2PMessage {
  int peer;    // pipeline rank it goes to or comes from
  int tag;     // unique per message in an iteration (MPI's tag; NCCL matches by order)
  int buffer;  // receive buffer (receives only)
};
struct PipelineStep {
  int t = 0;          // global step (the group index)
  int op = -1;        // index into the stage's op list, -1: nothing to compute at this step
  int input = -1;     // receive buffer holding the op's input, -1: none (first / last stage)
  std::vector<P2PMessage> sends, recvs;  // the group after the op (at most one send)
};
struct PipelinePlan {
  std::vector<PipelineStep> steps;  // this stage's steps with an op or messages, in order
  int buffers = 0;                  // receive buffers the stage needs
};
// ops_of(st): the op list of stage st (all stages are simulated, so every rank derives the same
// plan). Activations into virtual stage v (= chunk * stages + stage) for micro-batch k carry the
// tag v * m + k, gradients into it tag_backward + v * m + k. Forward-only lists (evaluation)
// send activations only.
PipelinePlan plan_lockstep(int stages, int stage, int m, int vp,
                           const std::function<std::vector<PipelineOp>(int)>& ops_of, int tag_backward);

// First layer and layer count of each stage. first/last: layers on the first and last stage
// (0: even split). Throws Error::all naming the deck keys when the layers do not divide.
std::vector<std::pair<std::int64_t, std::int64_t>> split_layers(std::int64_t layers, int stages, std::int64_t first,
                                                               std::int64_t last);

}  // namespace trident
