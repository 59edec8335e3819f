// Topology implementation: rank coordinates in Megatron's order (tp fastest, then cp, dp, pp),
// the MPI_Comm_split of the world into the tp, cp, dp, dp x cp, pp and embedding groups (and T5's regrouping
// in set_decoder_stage), their NCCL communicators enabled in the same order on every rank, and
// the rank table of print().
#include "comm/topology.hpp"

#include <iomanip>
#include <sstream>

#include "common/error.hpp"

namespace trident {

RankCoords Topology::coords_of(int g, int tp, int dp, int pp, int cp) {
  (void)pp;
  RankCoords c;
  c.tp = g % tp;
  c.cp = (g / tp) % cp;
  c.dp = (g / (tp * cp)) % dp;
  c.pp = g / (tp * cp * dp);
  return c;
}

int Topology::global_of(const RankCoords& c, int tp, int dp, int pp, int cp) {
  (void)pp;
  return c.tp + c.cp * tp + c.dp * tp * cp + c.pp * tp * cp * dp;
}

Topology::Topology(MPI_Comm world, int tp, int pp, int cp) : world_(world), tp_(tp), pp_(pp), cp_(cp) {
  const int n = world_.size();
  TRIDENT_REQUIRE(tp >= 1, "parallel.tp must be >= 1 (got " << tp << ")");
  TRIDENT_REQUIRE(pp >= 1, "parallel.pp must be >= 1 (got " << pp << ")");
  TRIDENT_REQUIRE(cp >= 1, "parallel.cp must be >= 1 (got " << cp << ")");
  TRIDENT_REQUIRE(n % (tp * cp * pp) == 0, "the world size " << n << " is not divisible by parallel.tp x parallel.cp x "
                                                             << "parallel.pp = " << tp << " x " << cp << " x " << pp
                                                             << " = " << tp * cp * pp);
  dp_ = n / (tp * cp * pp);
  me_ = coords_of(world_.rank(), tp_, dp_, pp_, cp_);
  // the experts' grid before set_expert_parallel: ep = etp = 1, every expert on every rank, one
  // replica per stage's tp x cp x dp ranks (what checkpoints of MoE models count as the experts' owner)
  edp_ = tp_ * cp_ * dp_;
  ex_ = expert_coords_of(world_.rank(), edp_, 1, 1);
  MPI_Comm c;
  // each group: the ranks that share the other coordinates; key = the rank within the group
  MPI_Comm_split(world, (me_.cp + me_.dp * cp_) + me_.pp * cp_ * dp_, me_.tp, &c);
  tp_group_ = Communicator(c);
  tp_group_.set_name("tp");
  MPI_Comm_split(world, (me_.tp + me_.cp * tp_) + me_.pp * tp_ * cp_, me_.dp, &c);
  dp_group_ = Communicator(c);
  dp_group_.set_name("dp");
  MPI_Comm_split(world, me_.tp + me_.cp * tp_ + me_.dp * tp_ * cp_, me_.pp, &c);
  pp_group_ = Communicator(c);
  pp_group_.set_name("pp");
  if (cp_ > 1) {
    MPI_Comm_split(world, (me_.tp + me_.dp * tp_) + me_.pp * tp_ * dp_, me_.cp, &c);
    cp_group_ = Communicator(c);
    cp_group_.set_name("cp");
    MPI_Comm_split(world, me_.tp + me_.pp * tp_, me_.cp + me_.dp * cp_, &c);
    dp_cp_group_ = Communicator(c);
    dp_cp_group_.set_name("dp_cp");
  } else {
    cp_group_ = Communicator::duplicate(MPI_COMM_SELF);
    cp_group_.set_name("cp");
  }
  const bool in_embedding = me_.pp == 0 || me_.pp == pp_ - 1;
  MPI_Comm_split(world, in_embedding ? me_.tp + me_.cp * tp_ + me_.dp * tp_ * cp_ : MPI_UNDEFINED, me_.pp, &c);
  if (c != MPI_COMM_NULL) embedding_group_ = Communicator(c);
  embedding_group_.set_name("embedding");
  // CUDA builds: NCCL communicators for the groups that move device buffers, created in the same
  // order on every rank (each creation is collective over its group).
  for (Communicator* g : {&tp_group_, &dp_group_, &pp_group_}) g->enable_device();
  if (cp_ > 1)
    for (Communicator* g : {&cp_group_, &dp_cp_group_}) g->enable_device();
  if (in_embedding) embedding_group_.enable_device();
}

ExpertCoords Topology::expert_coords_of(int g, int stage_ranks, int ep, int etp) {
  const int i = g % stage_ranks;  // the rank within its stage
  ExpertCoords c;
  c.etp = i % etp;
  c.ep = (i / etp) % ep;
  c.edp = i / (etp * ep);
  return c;
}

void Topology::set_expert_parallel(int ep, int etp) {
  TRIDENT_REQUIRE(ep >= 1, "parallel.ep must be >= 1 (got " << ep << ")");
  TRIDENT_REQUIRE(etp >= 1, "parallel.expert_tp must be >= 1 (got " << etp << ")");
  const int stage_ranks = tp_ * cp_ * dp_;
  TRIDENT_REQUIRE(stage_ranks % (ep * etp) == 0,
                  "parallel.ep x parallel.expert_tp = " << ep << " x " << etp << " = " << ep * etp
                                                        << " does not divide the tp x cp x dp = " << tp_ << " x " << cp_
                                                        << " x " << dp_ << " = " << stage_ranks
                                                        << " ranks of a pipeline stage (the experts' grid)");
  ep_ = ep;
  etp_ = etp;
  edp_ = stage_ranks / (ep * etp);
  ex_ = expert_coords_of(world_.rank(), stage_ranks, ep_, etp_);
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
  const int group = me_.tp + me_.cp * tp_ + me_.dp * tp_ * cp_;
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
  const bool cp = cp_ > 1;
  if (cp)
    s << "Topology: world " << world_.size() << " = tp " << tp_ << " x cp " << cp_ << " x dp " << dp_ << " x pp " << pp_
      << "  (global = tp_rank + cp_rank*tp + dp_rank*tp*cp + pp_rank*tp*cp*dp; gradients reduced over dp x cp = "
      << dp_ * cp_ << " ranks)\n";
  else
    s << "Topology: world " << world_.size() << " = tp " << tp_ << " x dp " << dp_ << " x pp " << pp_
      << "  (global = tp_rank + dp_rank*tp + pp_rank*tp*dp)\n";
  const bool experts = ep_group_.get() != MPI_COMM_NULL;
  if (experts)
    s << "Experts: world " << world_.size() << " = expert_tp " << etp_ << " x ep " << ep_ << " x expert_dp " << edp_
      << " x pp " << pp_ << "  (within a stage, i = tp_rank + " << (cp ? "cp_rank*tp + dp_rank*tp*cp" : "dp_rank*tp")
      << ": etp = i % expert_tp, ep = (i / expert_tp) % ep, edp = i / (expert_tp*ep))\n";
  s << "  rank  tp" << (cp ? "  cp" : "") << "  dp  pp" << (experts ? " etp  ep edp" : "") << "\n";
  const int n = world_.size();
  const int show = n <= 64 ? n : 16;
  for (int g = 0; g < show; ++g) {
    RankCoords c = coords_of_rank(g);
    s << "  " << std::setw(4) << g << std::setw(4) << c.tp;
    if (cp) s << std::setw(4) << c.cp;
    s << std::setw(4) << c.dp << std::setw(4) << c.pp;
    if (experts) {
      const ExpertCoords e = expert_coords_of_rank(g);
      s << std::setw(4) << e.etp << std::setw(4) << e.ep << std::setw(4) << e.edp;
    }
    s << "\n";
  }
  if (show < n) s << "  ... (" << n - show << " more ranks)\n";
  os << s.str() << std::flush;
}

}  // namespace trident
