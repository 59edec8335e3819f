// Pipeline executor: runs one stage's part of a schedule (train/pipeline_schedule.hpp) for a
// set of micro-batches, moving activations forward and their gradients backward between
// neighbouring stages with non-blocking point-to-point messages of shapes known up front
// ((rows, hidden) per micro-batch). Records per-rank timings and, optionally, a timeline.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "comm/topology.hpp"
#include "common/stream_mark.hpp"
#include "models/language_model.hpp"
#include "train/pipeline_schedule.hpp"

namespace trident {

struct TimelineEvent {
  double t0, t1;
  int micro;
  bool forward;
};

class PipelineRunner {
 public:
  // load(k, mb): the k-th micro-batch of this rank's share into mb's device views (called on
  // the stages that read it, LanguageModel::reads_micro_batch: the first and last, and every
  // stage of a padding-masked or encoder-decoder model, whose layers need the padding mask and
  // the decoder's tokens).
  using Loader = std::function<void(std::int64_t, MicroBatch&)>;
  // chunks: this rank's model chunks (one without interleaving; vp with the interleaved
  // schedule, chunk c being virtual stage c * pp + pp_rank).
  PipelineRunner(std::vector<LanguageModel*> chunks, const Topology& topo);

  // Forward and backward of m micro-batches in 1F1B order (interleaved when there are several
  // chunks); returns the sum of token losses
  // (non-zero on the last stage only). rng(k) gives micro-batch k's dropout streams.
  double train(std::int64_t m, const Loader& load, float dscale,
               const std::function<DropoutStreams(std::int64_t)>& rng);
  // Forward only (evaluation); count(k): samples of micro-batch k that count (<= B).
  double evaluate(std::int64_t m, const Loader& load, const std::function<std::int64_t(std::int64_t)>& count);

  // Seconds spent in forward, backward and waiting on point-to-point messages (cumulative). The
  // forward and backward passes are timed by marks in the device's queue (common/stream_mark.hpp),
  // read here: on a device, the first read after a step waits for its last pass.
  double forward_seconds() const {
    settle();
    return t_forward_;
  }
  double backward_seconds() const {
    settle();
    return t_backward_;
  }
  double p2p_seconds() const { return t_p2p_; }
  const std::vector<TimelineEvent>& events() const {
    settle();
    return events_;
  }
  void clear_events() {
    settle();
    events_.clear();
  }
  bool record = false;  // keep timeline events
  // Grouped point-to-point: messages travel in send + receive groups that follow the lock-step
  // plan of train/pipeline_schedule.hpp (deadlock-free for 1F1B, interleaved and forward-only
  // schedules alike). The NCCL path always works this way (NCCL has no tags and its sends wait
  // for the matching receive); on MPI it is chosen by debug.grouped_p2p, so the host tests
  // exercise the same order. Otherwise each message is a non-blocking MPI send, received when
  // its op runs.
  bool grouped_p2p = false;

 private:
  void wait(MPI_Request& r);
  // grouped mode: runs the plan's steps, compute(op, input) for ops, then each step's group
  // (sends from output(op)).
  void run_lockstep(const std::vector<PipelineOp>& ops, const PipelinePlan& plan,
                    const std::function<void(const PipelineOp&, const FloatView&)>& compute,
                    const std::function<float*(const PipelineOp&)>& output);
  std::vector<FloatView> pool_;  // grouped mode's receive buffers
  std::vector<LanguageModel*> chunks_;
  const Topology& topo_;
  MicroBatch mb_;
  FloatView recv_in_, recv_grad_;
  std::vector<std::vector<MPI_Request>> fwd_send_;  // [chunk][slot]
  std::vector<MPI_Request> bwd_send_;               // [chunk]
  // the passes timed since the last read: their marks, micro-batch, direction, and whether kept
  // as timeline events
  struct Pass {
    StreamMark begin, end;
    int micro;
    bool forward, keep;
  };
  void settle() const;
  mutable std::vector<Pass> passes_;
  mutable double t_forward_ = 0, t_backward_ = 0;
  double t_p2p_ = 0;
  mutable std::vector<TimelineEvent> events_;
};

// Gathers every rank's events to world rank 0 and writes a Chrome-trace JSON file there:
// one row (tid) per rank, one box per micro-batch forward or backward.
void write_timeline(const std::string& path, const std::vector<TimelineEvent>& events, const Topology& topo,
                    double t_origin);

}  // namespace trident
