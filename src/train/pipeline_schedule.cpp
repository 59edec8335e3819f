// Pipeline schedules and the layer split (pipeline_schedule.hpp; docs/DESIGN.md "Pipeline
// parallelism"): the 1F1B and interleaved op lists of one stage, the most micro-batches a chunk
// holds at once, plan_lockstep (every stage's op list simulated step by step, each message put in
// the group of the step that produced it, receive buffers reused once their op has run), and
// split_layers (an even split, or given first / last stage counts and the rest even).
#include "train/pipeline_schedule.hpp"

#include <algorithm>
#include <map>

#include "common/error.hpp"

namespace trident {

std::vector<PipelineOp> schedule_1f1b(int stages, int stage, int m) {
  std::vector<PipelineOp> ops;
  const int warmup = std::min(stages - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, f});
  while (f < m) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < m) ops.push_back({false, b++});
  return ops;
}

std::vector<PipelineOp> schedule_interleaved(int p, int s, int m, int vp) {
  TRIDENT_REQUIRE(m % p == 0, "the interleaved pipeline schedule needs the micro-batches per iteration ("
                                  << m << " = global_batch_size / (micro_batch_size x dp)) to be divisible by "
                                  << "parallel.pp (" << p << ")");
  const int total = m * vp, group = p * vp;
  auto fchunk = [&](int k) { return (k % group) / p; };
  auto micro = [&](int k) { return (k / group) * p + k % p; };
  const int warmup = m == p ? total : std::min((p - s - 1) * 2 + (vp - 1) * p, total);
  std::vector<PipelineOp> ops;
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, micro(f), fchunk(f)});
  while (f < total) {
    ops.push_back({true, micro(f), fchunk(f)});
    ++f;
    ops.push_back({false, micro(b), vp - 1 - fchunk(b)});
    ++b;
  }
  for (; b < total; ++b) ops.push_back({false, micro(b), vp - 1 - fchunk(b)});
  return ops;
}

int max_in_flight(const std::vector<PipelineOp>& ops, int chunks) {
  std::vector<int> now(static_cast<size_t>(chunks), 0);  // (chunks): micro-batches in flight
  int most = 1;
  for (const auto& op : ops) {
    now[op.chunk] += op.forward ? 1 : -1;
    most = std::max(most, now[op.chunk]);
  }
  return most;
}

PipelinePlan plan_lockstep(int p, int stage, int m, int vp, const std::function<std::vector<PipelineOp>(int)>& ops_of,
                           int tag_backward) {
  const int last_v = p * vp - 1;
  std::vector<std::vector<PipelineOp>> ops(static_cast<size_t>(p));  // (p): every stage's op list
  std::size_t remaining = 0;
  for (int st = 0; st < p; ++st) remaining += (ops[st] = ops_of(st)).size();
  // message (into virtual stage v, micro k) -> tag; step it was sent at; its buffer at `stage`
  auto tag = [&](bool backward, int v, int k) { return (backward ? tag_backward : 0) + v * m + k; };
  std::map<int, int> sent_at, buffer_of;
  std::vector<std::size_t> next(static_cast<size_t>(p), 0);  // (p): each stage's next op
  std::vector<int> free_buffers;                             // of `stage`'s pool
  PipelinePlan plan;
  struct Produced {
    int from, to, tag;
  };
  for (int t = 0; remaining > 0; ++t) {
    PipelineStep mine;
    mine.t = t;
    std::vector<Produced> produced;
    bool ran = false;
    for (int st = 0; st < p; ++st) {
      if (next[st] == ops[st].size()) continue;
      const PipelineOp& op = ops[st][next[st]];
      const int v = op.chunk * p + st;
      // the op's input message, if it has one: the activation from v - 1, or the gradient from v + 1
      const bool needs = op.forward ? v > 0 : v < last_v;
      const int in = tag(!op.forward, v, op.micro);
      if (needs) {
        const auto it = sent_at.find(in);
        if (it == sent_at.end() || it->second >= t) continue;  // not arrived yet: idle this step
      }
      if (st == stage) {
        mine.op = static_cast<int>(next[st]);
        if (needs) {
          mine.input = buffer_of.at(in);
          free_buffers.push_back(mine.input);  // free for this step's group onwards
        }
      }
      ++next[st];
      --remaining;
      ran = true;
      if (op.forward ? v < last_v : v > 0) {
        const int to_v = op.forward ? v + 1 : v - 1;
        produced.push_back({st, to_v % p, tag(!op.forward, to_v, op.micro)});
      }
    }
    // an idle step for every stage adds no message, so the next would be idle too
    TRIDENT_REQUIRE(ran, "pipeline schedule: the op lists of the stages cannot make progress at step " << t);
    for (const Produced& msg : produced) {
      sent_at[msg.tag] = t;
      if (msg.from == stage) mine.sends.push_back({msg.to, msg.tag, -1});
      if (msg.to == stage) {
        int b;
        if (free_buffers.empty()) {
          b = plan.buffers++;
        } else {
          b = free_buffers.back();
          free_buffers.pop_back();
        }
        buffer_of[msg.tag] = b;
        mine.recvs.push_back({msg.from, msg.tag, b});
      }
    }
    if (mine.op >= 0 || !mine.sends.empty() || !mine.recvs.empty()) plan.steps.push_back(std::move(mine));
  }
  return plan;
}

std::vector<std::pair<std::int64_t, std::int64_t>> split_layers(std::int64_t L, int p, std::int64_t first,
                                                                std::int64_t last) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;  // (p): first layer, count
  if (p == 1) return {{0, L}};
  if (first == 0 && last == 0) {
    TRIDENT_REQUIRE(L % p == 0, "model.num_layers (" << L << ") is not divisible by parallel.pp (" << p
                                                     << "); set parallel.first_stage_layers / last_stage_layers");
    for (int s = 0; s < p; ++s) out.push_back({s * (L / p), L / p});
    return out;
  }
  const std::int64_t f = first > 0 ? first : -1, l = last > 0 ? last : -1;
  const int middle = p - (f > 0 ? 1 : 0) - (l > 0 ? 1 : 0);
  const std::int64_t rest = L - std::max<std::int64_t>(f, 0) - std::max<std::int64_t>(l, 0);
  TRIDENT_REQUIRE(rest >= 0 && (middle == 0 ? rest == 0 : rest % middle == 0),
                  "the " << L << " layers do not split over " << p << " pipeline stages with "
                         << "parallel.first_stage_layers = " << first << " and parallel.last_stage_layers = " << last);
  const std::int64_t each = middle > 0 ? rest / middle : 0;
  std::int64_t at = 0;
  for (int s = 0; s < p; ++s) {
    const std::int64_t n = (s == 0 && f > 0) ? f : (s == p - 1 && l > 0) ? l : each;
    TRIDENT_REQUIRE(n > 0, "pipeline stage " << s << " would get no layers");
    out.push_back({at, n});
    at += n;
  }
  return out;
}

}  // namespace trident
