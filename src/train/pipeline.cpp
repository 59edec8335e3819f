// Pipeline executor.
#include "train/pipeline.hpp"

#include <fstream>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "train/pipeline_schedule.hpp"

namespace trident {

namespace {
constexpr int kBackwardTag = 1 << 20;  // tags: forward activation = micro, gradient = kBackwardTag + micro
}

PipelineRunner::PipelineRunner(std::vector<GptModel*> chunks, const Topology& topo)
    : chunks_(std::move(chunks)), topo_(topo), bwd_send_(chunks_.size(), MPI_REQUEST_NULL) {
  const GptModel& m = *chunks_.front();
  const std::int64_t rows = m.micro_batch() * m.config().seq_length;
  tokens_ = make_int("pipeline::tokens", rows);
  targets_ = make_int("pipeline::targets", rows);
  recv_in_ = make_float("pipeline::recv_in", m.activation_size());
  recv_grad_ = make_float("pipeline::recv_grad", m.activation_size());
}

void PipelineRunner::flush(const Communicator::P2POp* recv) {
  if (pending_.empty() && !recv) return;
  if (recv) pending_.push_back(*recv);
  const double t = wall_seconds();
  topo_.pp_group().p2p_group(pending_);
  t_p2p_ += wall_seconds() - t;
  pending_.clear();
}

void PipelineRunner::wait(MPI_Request& r) {
  if (r == MPI_REQUEST_NULL) return;
  const double t = wall_seconds();
  TRIDENT_CHECK_MPI(MPI_Wait(&r, MPI_STATUS_IGNORE));
  t_p2p_ += wall_seconds() - t;
}

double PipelineRunner::train(std::int64_t m, const Loader& load, float dscale,
                             const std::function<DropoutStreams(std::int64_t)>& rng) {
  const int p = topo_.pp_size(), s = topo_.coords().pp, vp = static_cast<int>(chunks_.size());
  const MPI_Comm pp = topo_.pp_group().get();
  const int n = static_cast<int>(chunks_.front()->activation_size());
  const int mi = static_cast<int>(m);
  const auto ops = vp == 1 ? schedule_1f1b(p, s, mi) : schedule_interleaved(p, s, mi, vp);
  const int slots = max_in_flight(ops, vp);  // in-flight micro-batches of a chunk are consecutive
  fwd_send_.assign(static_cast<size_t>(vp), std::vector<MPI_Request>(static_cast<size_t>(slots), MPI_REQUEST_NULL));
  const int prev = (s - 1 + p) % p, next = (s + 1) % p;
  // tags: activation entering virtual stage v for micro-batch k = v*m + k; gradients leaving it
  // backwards: kBackwardTag + v*m + k
  double loss = 0;
  // Grouping follows the 1F1B pairing; the interleaved schedule keeps MPI's non-blocking sends
  // (on GPUs that needs a CUDA-aware MPI).
  const bool grouped = (grouped_p2p || topo_.pp_group().device_enabled()) && vp == 1;
  for (const PipelineOp& op : ops) {
    GptModel& model = *chunks_[op.chunk];
    const bool pre = model.stage().pre, post = model.stage().post;
    const int v = op.chunk * p + s, slot = op.micro % slots;
    // what this step receives first, and what it sends after computing
    const int recv_tag = op.forward ? v * mi + op.micro : kBackwardTag + v * mi + op.micro;
    const int send_tag = op.forward ? (v + 1) * mi + op.micro : kBackwardTag + (v - 1) * mi + op.micro;
    const bool receives = op.forward ? !pre : !post, sends = op.forward ? !post : !pre;
    float* recv_buf = op.forward ? recv_in_.data() : recv_grad_.data();
    const int recv_peer = op.forward ? prev : next, send_peer = op.forward ? next : prev;
    if (op.forward && (pre || post)) load(op.micro, tokens_, targets_);
    if (grouped) {  // the pending send goes out with this step's receive, as one group
      const Communicator::P2POp in{false, recv_buf, n, recv_peer, recv_tag};
      flush(receives ? &in : nullptr);
    } else {
      if (receives) {
        const double t = wall_seconds();
        TRIDENT_CHECK_MPI(MPI_Recv(recv_buf, n, MPI_FLOAT, recv_peer, recv_tag, pp, MPI_STATUS_IGNORE));
        t_p2p_ += wall_seconds() - t;
      }
      // the slot's previous output (forward) or the chunk's input_grad() (backward) is reused
      wait(op.forward ? fwd_send_[op.chunk][slot] : bwd_send_[op.chunk]);
    }
    const double t0 = wall_seconds();
    if (op.forward) {
      loss += model.stage_forward(slot, tokens_, targets_, recv_in_, true, dscale, rng(op.micro));
    } else {
      model.final_backward = op.micro == mi - 1;  // the chunk's last backward of the iteration
      model.stage_backward(slot, recv_grad_);
      model.final_backward = false;
    }
    Kokkos::fence();
    const double t1 = wall_seconds();
    (op.forward ? t_forward_ : t_backward_) += t1 - t0;
    if (record) events_.push_back({t0, t1, op.micro, op.forward});
    if (!sends) continue;
    float* out = op.forward ? model.stage_output(slot).data() : model.input_grad().data();
    if (grouped)
      pending_.push_back({true, out, n, send_peer, send_tag});
    else
      TRIDENT_CHECK_MPI(MPI_Isend(out, n, MPI_FLOAT, send_peer, send_tag, pp,
                                  op.forward ? &fwd_send_[op.chunk][slot] : &bwd_send_[op.chunk]));
  }
  flush(nullptr);
  for (auto& chunk : fwd_send_)
    for (auto& r : chunk) wait(r);
  for (auto& r : bwd_send_) wait(r);
  return loss;
}

double PipelineRunner::evaluate(std::int64_t m, const Loader& load,
                                const std::function<std::int64_t(std::int64_t)>& count) {
  const int p = topo_.pp_size(), s = topo_.coords().pp;
  const MPI_Comm pp = topo_.pp_group().get();
  const int n = static_cast<int>(chunks_.front()->activation_size());
  const int prev = (s - 1 + p) % p, next = (s + 1) % p, mi = static_cast<int>(m);
  double loss = 0;
  const bool grouped = (grouped_p2p || topo_.pp_group().device_enabled()) && chunks_.size() == 1;
  for (int k = 0; k < mi; ++k) {
    for (size_t c = 0; c < chunks_.size(); ++c) {  // virtual stages in order
      GptModel& model = *chunks_[c];
      const bool pre = model.stage().pre, post = model.stage().post;
      const int v = static_cast<int>(c) * p + s;
      if (pre || post) load(k, tokens_, targets_);
      if (grouped) {
        const Communicator::P2POp in{false, recv_in_.data(), n, prev, v * mi + k};
        flush(pre ? nullptr : &in);
      } else if (!pre) {
        TRIDENT_CHECK_MPI(MPI_Recv(recv_in_.data(), n, MPI_FLOAT, prev, v * mi + k, pp, MPI_STATUS_IGNORE));
      }
      loss += model.stage_forward(0, tokens_, targets_, recv_in_, false, 0.f, DropoutStreams{}, count(k));
      Kokkos::fence();
      if (!post) {
        if (grouped)  // the slot's output stays valid until the next flush (before the next forward)
          pending_.push_back({true, model.stage_output(0).data(), n, next, (v + 1) * mi + k});
        else
          TRIDENT_CHECK_MPI(MPI_Send(model.stage_output(0).data(), n, MPI_FLOAT, next, (v + 1) * mi + k, pp));
      }
    }
  }
  flush(nullptr);
  return loss;
}

void write_timeline(const std::string& path, const std::vector<TimelineEvent>& events, const Topology& topo,
                    double t_origin) {
  const MPI_Comm world = topo.world().get();
  // one time origin for all ranks: steady_clock is one monotonic clock per node (rows of ranks
  // on different nodes are aligned at the earliest start, not synchronised)
  double origin = t_origin;
  MPI_Allreduce(&t_origin, &origin, 1, MPI_DOUBLE, MPI_MIN, world);
  t_origin = origin;
  std::vector<double> mine;
  for (const auto& e : events) {
    mine.push_back(e.t0 - t_origin);
    mine.push_back(e.t1 - t_origin);
    mine.push_back(e.micro);
    mine.push_back(e.forward ? 1.0 : 0.0);
  }
  const int size = topo.world_size(), rank = topo.world_rank();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), offs(size, 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world);
  if (rank == 0)
    for (int r = 1; r < size; ++r) offs[r] = offs[r - 1] + lens[r - 1];
  std::vector<double> all(rank == 0 ? static_cast<size_t>(offs[size - 1] + lens[size - 1]) : 0);
  MPI_Gatherv(mine.data(), len, MPI_DOUBLE, all.data(), lens.data(), offs.data(), MPI_DOUBLE, 0, world);
  if (rank != 0) return;
  std::ofstream out(path);
  TRIDENT_REQUIRE(out.good(), "log.timeline_file: cannot write '" << path << "'");
  out << "{\"traceEvents\": [\n";
  bool first = true;
  for (int r = 0; r < size; ++r) {
    const RankCoords c = Topology::coords_of(r, topo.tp_size(), topo.dp_size(), topo.pp_size());
    out << (first ? "" : ",\n") << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " << r
        << ", \"args\": {\"name\": \"rank " << r << " (pp " << c.pp << ", tp " << c.tp << ", dp " << c.dp << ")\"}}";
    first = false;
    for (int i = offs[r]; i < offs[r] + lens[r]; i += 4) {
      const bool fwd = all[i + 3] > 0.5;
      out << ",\n{\"name\": \"" << (fwd ? "F" : "B") << static_cast<int>(all[i + 2]) << "\", \"cat\": \""
          << (fwd ? "forward" : "backward") << "\", \"ph\": \"X\", \"pid\": 0, \"tid\": " << r
          << ", \"ts\": " << all[i] * 1e6 << ", \"dur\": " << (all[i + 1] - all[i]) * 1e6 << "}";
    }
  }
  out << "\n]}\n";
}

}  // namespace trident
