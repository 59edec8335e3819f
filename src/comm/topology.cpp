// Topology implementation: rank coordinates in Megatron's order (tp fastest, then dp, then pp),
// the MPI_Comm_split of the world into the tp, dp, pp and embedding groups (and T5's regrouping
// in set_decoder_stage), their NCCL communicators enabled in the same order on every rank, and
// the rank table of print().
#include "comm/topology.hpp"

#include <iomanip>
#include <sstream>

#include "common/error.hpp"

namespace trident {

RankCoords Topology::coords_of(int g, int tp, int dp, int pp) {
  (void)pp;
  RankCoords c;
  c.tp = g % tp;
  c.dp = (g / tp) % dp;
  c.pp = g / (tp * dp);
  return c;
}

int Topology::global_of(const RankCoords& c, int tp, int dp, int pp) {
  (void)pp;
  return c.tp + c.dp * tp + c.pp * tp * dp;
}

Topology::Topology(MPI_Comm world, int tp, int pp) : world_(world), tp_(tp), pp_(pp) {
  const int n = world_.size();
  TRIDENT_REQUIRE(tp >= 1, "parallel.tp must be >= 1 (got " << tp << ")");
  TRIDENT_REQUIRE(pp >= 1, "parallel.pp must be >= 1 (got " << pp << ")");
  TRIDENT_REQUIRE(n % (tp * pp) == 0, "the world size " << n << " is not divisible by parallel.tp x parallel.pp = "
                                                        << tp << " x " << pp << " = " << tp * pp);
  dp_ = n / (tp * pp);
  me_ = coords_of(world_.rank(), tp_, dp_, pp_);
  // the experts' grid before set_expert_parallel: ep = etp = 1, every expert on every rank, one
  // replica per stage's tp x dp ranks (what checkpoints of MoE models count as the experts' owner)
  edp_ = tp_ * dp_;
  ex_ = expert_coords_of(world_.rank(), tp_, dp_, 1, 1);
  MPI_Comm c;
  // tp group: same (dp, pp); key = tp rank
  MPI_Comm_split(world, me_.dp + me_.pp * dp_, me_.tp, &c);
  tp_group_ = Communicator(c);
  tp_group_.set_name("tp");
  MPI_Comm_split(world, me_.tp + me_.pp * tp_, me_.dp, &c);
  dp_group_ = Communicator(c);
  dp_group_.set_name("dp");
  MPI_Comm_split(world, me_.tp + me_.dp * tp_, me_.pp, &c);
  pp_group_ = Communicator(c);
  pp_group_.set_name("pp");
  const bool in_embedding = me_.pp == 0 || me_.pp == pp_ - 1;
  MPI_Comm_split(world, in_embedding ? me_.tp + me_.dp * tp_ : MPI_UNDEFINED, me_.pp, &c);
  if (c != MPI_COMM_NULL) embedding_group_ = Communicator(c);
  embedding_group_.set_name("embedding");
  // CUDA builds: NCCL communicators for the groups that move device buffers, created in the same
  // order on every rank (each creation is collective over its group).
  for (Communicator* g : {&tp_group_, &dp_group_, &pp_group_}) g->enable_device();
  if (in_embedding) embedding_group_.enable_device();
}

ExpertCoords Topology::expert_coords_of(int g, int tp, int dp, int ep, int etp) {
  const int i = g % (tp * dp);  // the rank within its stage
  ExpertCoords c;
  c.etp = i % etp;
  c.ep = (i / etp) % ep;
  c.edp = i / (etp * ep);
  return c;
}

void Topology::set_expert_parallel(int ep, int etp) {
  TRIDENT_REQUIRE(ep >= 1, "parallel.ep must be >= 1 (got " << ep << ")");
  TRIDENT_REQUIRE(etp >= 1, "parallel.expert_tp must be >= 1 (got " << etp << ")");
  TRIDENT_REQUIRE((tp_ * dp_) % (ep * etp) == 0,
                  "parallel.ep x parallel.expert_tp = "
                      << ep << " x " << etp << " = " << ep * etp << " does not divide the tp x dp = " << tp_ << " x "
                      << dp_ << " = " << tp_ * dp_ << " ranks of a pipeline stage (the experts' grid)");
  ep_ = ep;
  etp_ = etp;
  edp_ = tp_ * dp_ / (ep * etp);
  ex_ = expert_coords_of(world_.rank(), tp_, dp_, ep_, etp_);
  const int stage = me_.pp;
  MPI_Comm c;
  MPI_Comm_split(world_.get(), (stage * etp_ + ex_.etp) * edp_ + ex_.edp, ex_.ep, &c);
  ep_group_ = Communicator(c);
  ep_group_.set_name("ep");
  MPI_Comm_split(world_.get(), (stage * etp_ + ex_.etp) * ep_ + ex_.ep, ex_.edp, &c);
  edp_group_ = Communicator(c);
  edp_group_.set_name("edp");
  MPI_Comm_split(world_.get(), (stage * ep_ + ex_.ep) * edp_ + ex_.edp, ex_.etp, &c);
  etp_group_ = Communicator(c);
  etp_group_.set_name("etp");
  for (Communicator* g : {&ep_group_, &edp_group_, &etp_group_}) g->enable_device();
}

void Topology::set_decoder_stage(int stage) {
  TRIDENT_REQUIRE(stage >= 0 && stage < pp_, "internal: decoder stage " << stage << " outside the pipeline");
  const int group = me_.tp + me_.dp * tp_;
  MPI_Comm c;
  const bool in_embedding = me_.pp == 0 || me_.pp == pp_ - 1 || me_.pp == stage;
  MPI_Comm_split(world_.get(), in_embedding ? group : MPI_UNDEFINED, me_.pp, &c);
  embedding_group_ = c != MPI_COMM_NULL ? Communicator(c) : Communicator();
  embedding_group_.set_name("embedding");
  const bool in_position = me_.pp == 0 || me_.pp == stage;
  MPI_Comm_split(world_.get(), in_position ? group : MPI_UNDEFINED, me_.pp, &c);
  position_group_ = c != MPI_COMM_NULL ? Communicator(c) : Communicator();
  position_group_.set_name("position");
  if (in_embedding) embedding_group_.enable_device();
  if (in_position) position_group_.enable_device();
}

void Topology::print(std::ostream& os) const {
  if (world_.rank() != 0) return;
  std::ostringstream s;
  s << "Topology: world " << world_.size() << " = tp " << tp_ << " x dp " << dp_ << " x pp " << pp_
    << "  (global = tp_rank + dp_rank*tp + pp_rank*tp*dp)\n";
  const bool experts = ep_group_.get() != MPI_COMM_NULL;
  if (experts)
    s << "Experts: world " << world_.size() << " = expert_tp " << etp_ << " x ep " << ep_ << " x expert_dp " << edp_
      << " x pp " << pp_
      << "  (within a stage, i = tp_rank + dp_rank*tp: etp = i % expert_tp, ep = (i / expert_tp) % ep, "
      << "edp = i / (expert_tp*ep))\n";
  s << "  rank  tp  dp  pp" << (experts ? " etp  ep edp" : "") << "\n";
  const int n = world_.size();
  const int show = n <= 64 ? n : 16;
  for (int g = 0; g < show; ++g) {
    RankCoords c = coords_of(g, tp_, dp_, pp_);
    s << "  " << std::setw(4) << g << std::setw(4) << c.tp << std::setw(4) << c.dp << std::setw(4) << c.pp;
    if (experts) {
      const ExpertCoords e = expert_coords_of(g, tp_, dp_, ep_, etp_);
      s << std::setw(4) << e.etp << std::setw(4) << e.ep << std::setw(4) << e.edp;
    }
    s << "\n";
  }
  if (show < n) s << "  ... (" << n - show << " more ranks)\n";
  os << s.str() << std::flush;
}

}  // namespace trident
