// Pipeline schedules and the lock-step message plan of grouped point-to-point: every stage's
// ops run once and in order, each group's sends match the neighbours' receives of the same
// group index, receive buffers are never overwritten before use, and the plan adds no bubble
// beyond the schedule's own.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "train/pipeline_schedule.hpp"

namespace trident {
namespace {

constexpr int kBackward = 1 << 20;

struct Case {
  int p, m, vp;
  bool forward_only;
};

std::vector<PipelineOp> ops_of(const Case& c, int stage) {
  if (c.forward_only) {
    std::vector<PipelineOp> ops;
    for (int k = 0; k < c.m; ++k)
      for (int ch = 0; ch < c.vp; ++ch) ops.push_back({true, k, ch});
    return ops;
  }
  return c.vp == 1 ? schedule_1f1b(c.p, stage, c.m) : schedule_interleaved(c.p, stage, c.m, c.vp);
}

// Checks the plans of all stages of a case; returns the number of global steps.
int check_plans(const Case& c) {
  const int last_v = c.p * c.vp - 1;
  std::vector<PipelinePlan> plans;
  for (int s = 0; s < c.p; ++s)
    plans.push_back(plan_lockstep(c.p, s, c.m, c.vp, [&](int st) { return ops_of(c, st); }, kBackward));
  // (t, from, to) -> tags sent / received in that group
  std::map<std::tuple<int, int, int>, std::vector<int>> sent, received;
  int steps = 0;
  for (int s = 0; s < c.p; ++s) {
    const auto ops = ops_of(c, s);
    std::vector<int> pool(static_cast<size_t>(plans[s].buffers), -1);  // tag held, -1: free
    int next = 0, last_t = -1;
    for (const PipelineStep& step : plans[s].steps) {
      EXPECT_GT(step.t, last_t);
      last_t = step.t;
      EXPECT_LE(step.sends.size(), 1u);
      if (step.op >= 0) {
        EXPECT_EQ(step.op, next++) << "stage " << s << ": ops out of order";
        const PipelineOp& op = ops[step.op];
        const int v = op.chunk * c.p + s;
        const bool needs = op.forward ? v > 0 : v < last_v;
        if (needs) {
          EXPECT_GE(step.input, 0);
          const int want = (op.forward ? 0 : kBackward) + v * c.m + op.micro;
          EXPECT_EQ(pool.at(step.input), want) << "stage " << s << " step " << step.t << ": wrong input";
          pool.at(step.input) = -1;
        } else {
          EXPECT_EQ(step.input, -1);
        }
        for (const P2PMessage& m : step.sends) {
          const int to_v = op.forward ? v + 1 : v - 1;
          EXPECT_EQ(m.tag, (op.forward ? 0 : kBackward) + to_v * c.m + op.micro);
          EXPECT_EQ(m.peer, to_v % c.p);
          sent[{step.t, s, m.peer}].push_back(m.tag);
        }
      } else {
        EXPECT_TRUE(step.sends.empty());
      }
      for (const P2PMessage& m : step.recvs) {
        EXPECT_EQ(pool.at(m.buffer), -1) << "stage " << s << ": receive buffer " << m.buffer << " still in use";
        pool.at(m.buffer) = m.tag;
        received[{step.t, m.peer, s}].push_back(m.tag);
      }
      steps = std::max(steps, step.t + 1);
    }
    EXPECT_EQ(next, static_cast<int>(ops.size())) << "stage " << s << ": not every op ran";
    for (int tag : pool) EXPECT_EQ(tag, -1) << "stage " << s << ": message " << tag << " received but never used";
  }
  EXPECT_EQ(sent, received);
  return steps;
}

TEST(PipelineSchedule, LockstepPlanOf1F1BMatchesEveryMessageAndAddsNoBubble) {
  for (auto [p, m] : {std::pair{2, 4}, {4, 8}, {4, 3}, {3, 1}, {8, 16}}) {
    const int steps = check_plans({p, m, 1, false});
    // unit-time forward and backward: 2m ops per stage plus the (p - 1)-step fill and drain
    EXPECT_EQ(steps, 2 * (m + p - 1)) << "p " << p << " m " << m;
  }
}

TEST(PipelineSchedule, LockstepPlanOfTheInterleavedScheduleMatchesEveryMessage) {
  for (auto [p, m, vp] : {std::tuple{2, 4, 2}, {4, 8, 2}, {2, 2, 3}, {4, 4, 2}, {3, 6, 3}, {4, 16, 4}}) {
    const int steps = check_plans({p, m, vp, false});
    // ops are 1/vp of a stage's layers: the bubble shrinks to 2 (p - 1) chunk steps
    EXPECT_LE(steps, 2 * (m * vp + p - 1) + 2 * (p - 1)) << "p " << p << " m " << m << " vp " << vp;
    EXPECT_GE(steps, 2 * (m * vp + p - 1));
  }
}

TEST(PipelineSchedule, LockstepPlanOfEvaluationPipelinesTheForwardPasses) {
  for (auto [p, m, vp] : {std::tuple{2, 4, 1}, {4, 2, 1}, {2, 3, 2}, {4, 8, 3}}) {
    const int steps = check_plans({p, m, vp, true});
    if (vp == 1)
      EXPECT_EQ(steps, m + p - 1) << "p " << p << " m " << m;
    else  // each micro-batch passes the virtual stages in order, the next one following it
      EXPECT_LE(steps, m * vp * p) << "p " << p << " m " << m << " vp " << vp;
  }
}

TEST(PipelineSchedule, OneFOneBWarmupAndInFlightLimit) {
  const auto ops = schedule_1f1b(4, 1, 8);
  ASSERT_EQ(ops.size(), 16u);
  EXPECT_TRUE(ops[0].forward && ops[1].forward && ops[2].forward && !ops[3].forward);  // 2 warm-up + 1F1B
  EXPECT_EQ(max_in_flight(ops, 1), 3);
  EXPECT_EQ(max_in_flight(schedule_1f1b(4, 3, 8), 1), 1);
}

}  // namespace
}  // namespace trident
