// Topology: the world split into tensor-, context-, data- and pipeline-parallel groups, Megatron's
// order (tp varies fastest, then cp, then dp, then pp):
//     global = tp_rank + cp_rank * tp + dp_rank * tp * cp + pp_rank * tp * cp * dp
// so that dp = world / (tp * cp * pp). The context-parallel ranks of a group hold different parts
// of the same sequences (parallel.cp); gradients are reduced, and ZeRO-1 shards, over the
// data-parallel x context-parallel group (dp_cp_group: the ranks with the same tp and pp rank).
// Example, world = 8, tp = 2, pp = 2, dp = 2 (cp = 1):
//     rank:     0 1 2 3 4 5 6 7
//     tp_rank:  0 1 0 1 0 1 0 1
//     dp_rank:  0 0 1 1 0 0 1 1
//     pp_rank:  0 0 0 0 1 1 1 1
//   tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
//   pp groups {0,4} {1,5} {2,6} {3,7}; embedding groups = first and last stage of each pp group.
// T5 (encoder-decoder, Megatron's split rank): the embedding group also holds the stage where the
// decoder starts, and a position-embedding group holds the first stage and that one.
#pragma once
#include <ostream>

#include "comm/communicator.hpp"

namespace trident {

struct RankCoords {
  int tp = 0, dp = 0, pp = 0, cp = 0;
};
// A rank's place in the experts' grid (Megatron's expert decomposition, order tp-ep-dp-pp): within
// a pipeline stage the tp x cp x dp ranks, numbered i = tp_rank + cp_rank * tp + dp_rank * tp * cp,
// are regrouped as
//     etp_rank = i % etp, ep_rank = (i / etp) % ep, edp_rank = i / (etp * ep)
// so that etp x ep x edp = tp x cp x dp: expert parallelism is carved out of the data-parallel
// (and, with etp < tp, the tensor-parallel) ranks. Example, tp = 2, dp = 2, ep = 2, etp = 1: ranks
// {0, 1} and {2, 3} of a stage form the expert-parallel groups, {0, 2} and {1, 3} the
// expert-data-parallel ones.
struct ExpertCoords {
  int etp = 0, ep = 0, edp = 0;
};

class Topology {
 public:
  // dp = world / (tp * cp * pp); throws Error::all naming the sizes when they do not divide.
  Topology(MPI_Comm world, int tp, int pp, int cp = 1);

  static RankCoords coords_of(int global, int tp, int dp, int pp, int cp = 1);
  static int global_of(const RankCoords& c, int tp, int dp, int pp, int cp = 1);
  // coords_of for this topology's sizes
  RankCoords coords_of_rank(int global) const { return coords_of(global, tp_, dp_, pp_, cp_); }

  int world_size() const { return world_.size(); }
  int world_rank() const { return world_.rank(); }
  int tp_size() const { return tp_; }
  int pp_size() const { return pp_; }
  int dp_size() const { return dp_; }
  int cp_size() const { return cp_; }
  const RankCoords& coords() const { return me_; }
  bool is_first_stage() const { return me_.pp == 0; }
  bool is_last_stage() const { return me_.pp == pp_ - 1; }

  const Communicator& world() const { return world_; }
  const Communicator& tp_group() const { return tp_group_; }
  // the ranks reading other samples (same tp, cp and pp rank)
  const Communicator& dp_group() const { return dp_group_; }
  // the ranks holding the other parts of this rank's sequences (same tp, dp and pp rank)
  const Communicator& cp_group() const { return cp_group_; }
  // the ranks holding the same parameters (same tp and pp rank): dp x cp ranks, over which the
  // gradients are reduced, ZeRO-1 shards, and the loss is summed (dp_group() when cp = 1)
  const Communicator& dp_cp_group() const { return cp_ > 1 ? dp_cp_group_ : dp_group_; }
  const Communicator& pp_group() const { return pp_group_; }
  // First and last pipeline stage of this rank's pp group (null communicator elsewhere).
  const Communicator& embedding_group() const { return embedding_group_; }
  // T5: the stages that hold the position embeddings (the first and the decoder's first).
  const Communicator& position_group() const { return position_group_; }
  // T5 with pipelining: `stage` starts the decoder (embeds its tokens, so it holds copies of the
  // word and position embeddings); regroups embedding_group() as {first, stage, last} and
  // position_group() as {first, stage} (collective over the world).
  void set_decoder_stage(int stage);

  // Expert parallelism (collective over the world): splits every stage's tp x cp x dp ranks into
  // the experts' grid above, ep x etp dividing tp x cp x dp (Error::all naming the sizes otherwise).
  void set_expert_parallel(int ep, int etp);
  // `stage_ranks` = tp x cp x dp
  static ExpertCoords expert_coords_of(int global, int stage_ranks, int ep, int etp);
  ExpertCoords expert_coords_of_rank(int global) const { return expert_coords_of(global, tp_ * cp_ * dp_, ep_, etp_); }
  int ep_size() const { return ep_; }
  int etp_size() const { return etp_; }
  int edp_size() const { return edp_; }
  const ExpertCoords& expert_coords() const { return ex_; }
  // the ranks of a stage holding the other experts (same etp and edp rank); those holding the
  // same experts (same etp and ep rank: the experts' gradients are summed over them, ZeRO-1
  // shards their state over them); those splitting the same experts' matrices. Before
  // set_expert_parallel: ep = etp = 1, the expert-data-parallel group spans the stage's tp x cp x dp.
  const Communicator& ep_group() const { return ep_group_; }
  const Communicator& edp_group() const { return edp_group_; }
  const Communicator& etp_group() const { return etp_group_; }

  // The table of all ranks and their groups (call on every rank; prints on world rank 0).
  void print(std::ostream& os) const;

 private:
  Communicator world_;
  int tp_, pp_, cp_, dp_, ep_ = 1, etp_ = 1, edp_ = 1;
  RankCoords me_;
  ExpertCoords ex_;
  Communicator tp_group_, dp_group_, cp_group_, dp_cp_group_, pp_group_, embedding_group_, position_group_;
  Communicator ep_group_, edp_group_, etp_group_;
};

}  // namespace trident
