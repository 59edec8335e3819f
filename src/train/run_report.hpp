// End-of-run reports of the trainer, on rank 0: every rank's phase timers, and the run's totals
// (iterations, samples, time per phase, communication per iteration of the tp and dp groups).
// The memory report is train/memory_report.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/topology.hpp"
#include "common/timer.hpp"

namespace trident {

// mine: this rank's seconds of forward, backward, p2p wait, gradient reduction and optimizer.
// Rank 0 prints a table of every rank's (when there is more than one). Collective over the world.
void print_rank_timers(const std::vector<double>& mine, const Topology& topo);
// Rank 0 only: "done: ..." with the time per phase and the communication per iteration over the
// iterations_run iterations of this job (evaluations included).
void print_run_totals(std::int64_t iteration, std::int64_t consumed, double seconds, std::int64_t iterations_run,
                      const PhaseTimers& timers, const Topology& topo);

}  // namespace trident
