// Topology and collective error agreement under MPI (run with np = 2 and 4): Megatron's rank
// order on the worked example of topology.hpp, group sizes and members against the formula for
// every (tp, pp) that divides the world, an error on every rank for sizes that do not divide,
// and one rank's exception turned into the same Error::all on every rank (collectively).
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/agreement.hpp"
#include "comm/topology.hpp"
#include "common/error.hpp"

using namespace trident;

TEST(Topology, MegatronRankOrderWorkedExample) {
  // world 8 = tp 2 x dp 2 x pp 2 (the example in topology.hpp)
  const int expect_tp[] = {0, 1, 0, 1, 0, 1, 0, 1}, expect_dp[] = {0, 0, 1, 1, 0, 0, 1, 1},
            expect_pp[] = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int g = 0; g < 8; ++g) {
    RankCoords c = Topology::coords_of(g, 2, 2, 2);
    EXPECT_EQ(c.tp, expect_tp[g]);
    EXPECT_EQ(c.dp, expect_dp[g]);
    EXPECT_EQ(c.pp, expect_pp[g]);
    EXPECT_EQ(Topology::global_of(c, 2, 2, 2), g);
  }
}

TEST(Topology, GroupsMatchTheFormula) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp) {
      if (world % (tp * pp)) continue;
      Topology t(MPI_COMM_WORLD, tp, pp);
      EXPECT_EQ(t.tp_size() * t.dp_size() * t.pp_size(), world);
      EXPECT_EQ(t.tp_group().size(), tp);
      EXPECT_EQ(t.dp_group().size(), world / (tp * pp));
      EXPECT_EQ(t.pp_group().size(), pp);
      EXPECT_EQ(t.tp_group().rank(), t.coords().tp);
      EXPECT_EQ(t.dp_group().rank(), t.coords().dp);
      EXPECT_EQ(t.pp_group().rank(), t.coords().pp);
      // every member of my tp group shares my (dp, pp): sum of global ranks matches the formula
      double sum = t.tp_group().allreduce_sum(static_cast<double>(rank));
      double want = 0;
      for (int r = 0; r < tp; ++r) want += Topology::global_of({r, t.coords().dp, t.coords().pp}, tp, t.dp_size(), pp);
      EXPECT_EQ(sum, want);
      sum = t.dp_group().allreduce_sum(static_cast<double>(rank));
      want = 0;
      for (int r = 0; r < t.dp_size(); ++r)
        want += Topology::global_of({t.coords().tp, r, t.coords().pp}, tp, t.dp_size(), pp);
      EXPECT_EQ(sum, want);
      const bool in_emb = t.is_first_stage() || t.is_last_stage();
      EXPECT_EQ(t.embedding_group().get() != MPI_COMM_NULL, in_emb);
    }
}

TEST(Topology, SizesThatDoNotDivideAreAnErrorOnEveryRank) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  try {
    Topology t(MPI_COMM_WORLD, world + 1, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.scope(), Error::Scope::all_ranks);
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
}

TEST(Errors, OneRanksFailureBecomesEveryRanksError) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    collectively(MPI_COMM_WORLD, [&] {
      if (rank == 1) throw std::runtime_error("shard 7 is unreadable");
    });
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    EXPECT_EQ(world, 1);  // only a single rank gets here
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "shard 7 is unreadable");
  }
  EXPECT_NO_THROW(agree_or_throw(MPI_COMM_WORLD, ""));
}
