// End-of-run reports of the trainer (train/run_report.hpp).
#include "train/run_report.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <vector>

namespace trident {

void print_rank_timers(const std::vector<double>& mine, const Topology& topo) {
  const std::vector<double> all = topo.world().gatherv_to_root(mine);
  if (topo.world().rank() == 0 && topo.world_size() > 1) {
    std::ostringstream os;
    os << "timers per rank (s): rank | pp tp dp | forward | backward | p2p wait | grad reduction | optimizer\n";
    for (int r = 0; r < topo.world_size(); ++r) {
      const RankCoords c = topo.coords_of_rank(r);
      os << "  " << std::setw(4) << r << " | " << c.pp << " " << c.tp << " " << c.dp << std::fixed
         << std::setprecision(3);
      for (int k = 0; k < 5; ++k) os << " | " << std::setw(8) << all[5 * r + k];
      os << "\n";
    }
    std::cout << os.str() << std::flush;
  }
}

void print_run_totals(std::int64_t iteration, std::int64_t consumed, double seconds, std::int64_t iterations_run,
                      const PhaseTimers& timers, const Topology& topo) {
  std::ostringstream os;
  os << "done: " << iteration << " iterations, " << consumed << " samples consumed, " << std::fixed
     << std::setprecision(1) << seconds << " s. Time per phase (rank 0):";
  for (auto& [name, sec] : timers.totals()) os << " " << name << " " << std::setprecision(2) << sec << " s;";
  const double n = static_cast<double>(std::max<std::int64_t>(iterations_run, 1));
  os << "\ncommunication per iteration (rank 0, evaluations included):";
  std::vector<const Communicator*> groups = {&topo.tp_group(), &topo.dp_group()};
  if (topo.cp_size() > 1) {  // the ring's key/value blocks, and the gradients' reduction over dp x cp
    groups.push_back(&topo.cp_group());
    groups.push_back(&topo.dp_cp_group());
  }
  if (topo.ep_group().get() != MPI_COMM_NULL) {  // MoE: the token exchange and the experts' reduction
    groups.push_back(&topo.ep_group());
    groups.push_back(&topo.edp_group());
  }
  for (const Communicator* g : groups) {
    os << (g == &topo.tp_group() ? " tp" : " | " + g->name());
    if (g->all_stats().empty()) os << " none";
    for (auto& [kind, st] : g->all_stats())
      os << " " << kind << " " << std::setprecision(1) << st.calls / n << " calls " << std::setprecision(3)
         << st.bytes / n / 1e6 << " MB;";
  }
  std::cout << os.str() << std::endl;
}

}  // namespace trident
