// PipelineRunner and the timeline writer (pipeline.hpp; docs/DESIGN.md "Pipeline parallelism").
// train() runs this stage's 1F1B or interleaved op list: by default each input is received with
// MPI_Recv when its op runs and each output sent with MPI_Isend, tagged virtual_stage * m + micro
// (forward) or 2^20 + the same (backward); in grouped mode (NCCL, or debug.grouped_p2p) the ops
// run in the send + receive groups of the lock-step plan. evaluate() is forward-only. Forward,
// backward and wait times accumulate; write_timeline gathers every rank's boxes to world rank 0
// and writes them as Chrome-trace JSON.
#include "train/pipeline.hpp"

#include <algorithm>
#include <fstream>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/progress.hpp"
#include "common/timer.hpp"
#include "train/pipeline_schedule.hpp"

namespace trident {

namespace {
constexpr int kBackwardTag = 1 << 20;  // tags: forward activation = micro, gradient = kBackwardTag + micro
}

// The passes timed since the last read: the last one waited for (on a device), the earlier ones
// passed by then.
void PipelineRunner::settle() const {
  if (passes_.empty()) return;
  const Pass& last = passes_.back();
  const double last_seconds = StreamMark::seconds(last.begin, last.end);
  for (std::size_t i = 0; i < passes_.size(); ++i) {
    const Pass& p = passes_[i];
    (p.forward ? t_forward_ : t_backward_) += i + 1 == passes_.size() ? last_seconds
                                                                      : StreamMark::elapsed(p.begin, p.end);
    if (p.keep) events_.push_back({p.begin.wall(), p.end.wall(), p.micro, p.forward});
  }
  passes_.clear();
}

PipelineRunner::PipelineRunner(std::vector<LanguageModel*> chunks, const Topology& topo)
    : chunks_(std::move(chunks)), topo_(topo), bwd_send_(chunks_.size(), MPI_REQUEST_NULL) {
  const LanguageModel& m = *chunks_.front();
  mb_ = m.allocate_micro_batch();
  recv_in_ = make_float("pipeline::recv_in", m.activation_size());
  recv_grad_ = make_float("pipeline::recv_grad", m.activation_size());
}

void PipelineRunner::run_lockstep(const std::vector<PipelineOp>& ops, const PipelinePlan& plan,
                                  const std::function<void(const PipelineOp&, const FloatView&)>& compute,
                                  const std::function<float*(const PipelineOp&)>& output) {
  const std::int64_t n = chunks_.front()->activation_size();
  while (static_cast<int>(pool_.size()) < plan.buffers) pool_.push_back(make_float("pipeline::recv", n));
  std::vector<Communicator::P2POp> group;  // one step's sends and receives
  for (const PipelineStep& step : plan.steps) {
    if (step.op >= 0) compute(ops[step.op], step.input >= 0 ? pool_[step.input] : recv_in_);
    group.clear();
    for (const P2PMessage& m : step.sends) group.push_back({true, output(ops[step.op]), n, m.peer, m.tag});
    for (const P2PMessage& m : step.recvs) group.push_back({false, pool_[m.buffer].data(), n, m.peer, m.tag});
    if (group.empty()) continue;
    const double t = wall_seconds();
    topo_.pp_group().p2p_group(group);
    t_p2p_ += wall_seconds() - t;
  }
}

void PipelineRunner::wait(MPI_Request& r) {
  if (r == MPI_REQUEST_NULL) return;
  const double t = wall_seconds();
  const progress::InComm in_comm("wait for a pipeline send", "pp", -1);
  Communicator::wait(r);
  t_p2p_ += wall_seconds() - t;
}

// Pipeline messages are tagged by the virtual stage they enter and the micro-batch (forward:
// below kBackwardTag, backward: kBackwardTag + the same): every tag of m micro-batches over p x vp
// virtual stages must stay below kBackwardTag and within the library's MPI_TAG_UB.
namespace {
void check_tags(std::int64_t m, int p, int vp, const Communicator& pp) {
  const std::int64_t span = (static_cast<std::int64_t>(p) * vp + 1) * m;
  TRIDENT_REQUIRE(span < kBackwardTag && kBackwardTag + span <= pp.max_tag(),
                  "pipeline: " << m << " micro-batches over " << p * vp << " (virtual) stages need message tags up to "
                               << kBackwardTag + span << ", beyond what this MPI library allows ("
                               << std::min<std::int64_t>(kBackwardTag - 1, pp.max_tag())
                               << "): use fewer micro-batches per "
                               << "iteration (a larger train.micro_batch_size) or fewer stages");
}
}  // namespace

double PipelineRunner::train(std::int64_t m, const Loader& load, float dscale,
                             const std::function<DropoutStreams(std::int64_t)>& rng) {
  const int p = topo_.pp_size(), s = topo_.coords().pp, vp = static_cast<int>(chunks_.size());
  if (p > 1) check_tags(m, p, vp, topo_.pp_group());
  const Communicator& pp = topo_.pp_group();
  const std::int64_t n = chunks_.front()->activation_size();
  const int mi = static_cast<int>(m);
  auto schedule = [&](int stage) {
    return vp == 1 ? schedule_1f1b(p, stage, mi) : schedule_interleaved(p, stage, mi, vp);
  };
  const auto ops = schedule(s);
  const int slots = max_in_flight(ops, vp);  // in-flight micro-batches of a chunk are consecutive
  double loss = 0;
  auto compute = [&](const PipelineOp& op, const FloatView& input) {
    LanguageModel& model = *chunks_[op.chunk];
    const int slot = op.micro % slots;
    if (op.forward && model.reads_micro_batch()) load(op.micro, mb_);
    const StreamMark t0 = StreamMark::record();
    if (op.forward) {
      loss += model.stage_forward(slot, mb_, input, true, dscale, rng(op.micro));
    } else {
      model.final_backward = op.micro == mi - 1;  // the chunk's last backward of the iteration
      model.stage_backward(slot, input);
      model.final_backward = false;
    }
    passes_.push_back({t0, StreamMark::record(), op.micro, op.forward, record});
  };
  // what a step sends after computing: the slot's stage output, or the chunk's input gradient
  auto output = [&](const PipelineOp& op) {
    LanguageModel& model = *chunks_[op.chunk];
    return op.forward ? model.stage_output(op.micro % slots).data() : model.input_grad().data();
  };
  // the losses a head kept on the device (read once per step) after those it returned
  auto total = [&] {
    for (LanguageModel* c : chunks_) loss += c->take_device_loss();
    return loss;
  };
  if (grouped_p2p || topo_.pp_group().device_enabled()) {
    run_lockstep(ops, plan_lockstep(p, s, mi, vp, schedule, kBackwardTag), compute, output);
    return total();
  }
  fwd_send_.assign(static_cast<size_t>(vp), std::vector<MPI_Request>(static_cast<size_t>(slots), MPI_REQUEST_NULL));
  const int prev = (s - 1 + p) % p, next = (s + 1) % p;
  for (const PipelineOp& op : ops) {
    LanguageModel& model = *chunks_[op.chunk];
    const bool pre = model.stage().pre, post = model.stage().post;
    const int v = op.chunk * p + s, slot = op.micro % slots;
    // what this step receives first (tagged by the virtual stage it enters), and sends after
    const int recv_tag = op.forward ? v * mi + op.micro : kBackwardTag + v * mi + op.micro;
    const int send_tag = op.forward ? (v + 1) * mi + op.micro : kBackwardTag + (v - 1) * mi + op.micro;
    const bool receives = op.forward ? !pre : !post, sends = op.forward ? !post : !pre;
    FloatView& in = op.forward ? recv_in_ : recv_grad_;  // (activation_size)
    if (receives) {
      const double t = wall_seconds();
      const progress::InComm in_comm(op.forward ? "pipeline receive of activations" : "pipeline receive of gradients",
                                     "pp", topo_.pp_size(), op.forward ? prev : next);
      pp.recv(in.data(), n, op.forward ? prev : next, recv_tag);
      t_p2p_ += wall_seconds() - t;
    }
    // the slot's previous output (forward) or the chunk's input_grad() (backward) is reused
    wait(op.forward ? fwd_send_[op.chunk][slot] : bwd_send_[op.chunk]);
    compute(op, in);
    if (sends)
      (op.forward ? fwd_send_[op.chunk][slot] : bwd_send_[op.chunk]) = pp.isend(output(op), n, op.forward ? next : prev,
                                                                                send_tag);
  }
  for (auto& chunk : fwd_send_)
    for (auto& r : chunk) wait(r);
  for (auto& r : bwd_send_) wait(r);
  return total();
}

double PipelineRunner::evaluate(std::int64_t m, const Loader& load,
                                const std::function<std::int64_t(std::int64_t)>& count) {
  const int p = topo_.pp_size(), s = topo_.coords().pp, vp = static_cast<int>(chunks_.size());
  if (p > 1) check_tags(m, p, vp, topo_.pp_group());
  const Communicator& pp = topo_.pp_group();
  const std::int64_t n = chunks_.front()->activation_size();
  const int prev = (s - 1 + p) % p, next = (s + 1) % p, mi = static_cast<int>(m);
  double loss = 0;
  auto schedule = [&](int) {  // every stage: the micro-batches in order, each through its chunks
    std::vector<PipelineOp> ops;
    for (int k = 0; k < mi; ++k)
      for (int c = 0; c < vp; ++c) ops.push_back({true, k, c});
    return ops;
  };
  auto compute = [&](const PipelineOp& op, const FloatView& input) {
    LanguageModel& model = *chunks_[op.chunk];
    if (model.reads_micro_batch()) load(op.micro, mb_);
    loss += model.stage_forward(0, mb_, input, false, 0.f, DropoutStreams{}, count(op.micro));
    TRIDENT_DEVICE_WAIT();
  };
  const auto ops = schedule(s);
  if (grouped_p2p || topo_.pp_group().device_enabled()) {
    // slot 0's output stays valid until its group (right after the forward) completes
    run_lockstep(ops, plan_lockstep(p, s, mi, vp, schedule, kBackwardTag), compute,
                 [&](const PipelineOp& op) { return chunks_[op.chunk]->stage_output(0).data(); });
    return loss;
  }
  for (const PipelineOp& op : ops) {
    LanguageModel& model = *chunks_[op.chunk];
    const int v = op.chunk * p + s;
    if (!model.stage().pre) {
      const progress::InComm in_comm("pipeline receive of activations", "pp", topo_.pp_size(), prev);
      pp.recv(recv_in_.data(), n, prev, v * mi + op.micro);
    }
    compute(op, recv_in_);
    if (!model.stage().post) {
      const progress::InComm in_comm("pipeline send of activations", "pp", topo_.pp_size(), next);
      pp.send(model.stage_output(0).data(), n, next, (v + 1) * mi + op.micro);
    }
  }
  return loss;
}

void write_timeline(const std::string& path, const std::vector<TimelineEvent>& events, const Topology& topo,
                    double t_origin) {
  // one time origin for all ranks: steady_clock is one monotonic clock per node (rows of ranks
  // on different nodes are aligned at the earliest start, not synchronised)
  t_origin = topo.world().allreduce_min(t_origin);
  std::vector<double> mine;  // (4 * events): t0, t1, micro, forward per event
  for (const auto& e : events) {
    mine.push_back(e.t0 - t_origin);
    mine.push_back(e.t1 - t_origin);
    mine.push_back(e.micro);
    mine.push_back(e.forward ? 1.0 : 0.0);
  }
  const int size = topo.world_size(), rank = topo.world_rank();
  std::vector<int> lens;  // (world size) on rank 0: each rank's values
  const std::vector<double> all = topo.world().gatherv_to_root(mine, &lens);  // rank after rank
  if (rank != 0) return;
  std::ofstream out(path);
  TRIDENT_REQUIRE(out.good(), "log.timeline_file: cannot write '" << path << "'");
  out << "{\"traceEvents\": [\n";
  bool first = true;
  for (int r = 0, at = 0; r < size; at += lens[r], ++r) {
    const RankCoords c = topo.coords_of_rank(r);
    out << (first ? "" : ",\n") << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " << r
        << ", \"args\": {\"name\": \"rank " << r << " (pp " << c.pp << ", tp " << c.tp << ", dp " << c.dp << ")\"}}";
    first = false;
    for (int i = at; i < at + lens[r]; i += 4) {
      const bool fwd = all[i + 3] > 0.5;
      out << ",\n{\"name\": \"" << (fwd ? "F" : "B") << static_cast<int>(all[i + 2]) << "\", \"cat\": \""
          << (fwd ? "forward" : "backward") << "\", \"ph\": \"X\", \"pid\": 0, \"tid\": " << r
          << ", \"ts\": " << all[i] * 1e6 << ", \"dur\": " << (all[i + 1] - all[i]) * 1e6 << "}";
    }
  }
  out << "\n]}\n";
}

}  // namespace trident
