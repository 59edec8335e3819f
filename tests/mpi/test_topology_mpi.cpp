// Topology and collective error agreement under MPI (run with np = 2 and 4): Megatron's rank
// order on the worked example of topology.hpp, the context-parallel order tp-cp-dp-pp and its
// groups (cp, dp, dp x cp, tp, pp) against the formula, group sizes and members against the formula for
// every (tp, pp) that divides the world, an error on every rank for sizes that do not divide,
// and one rank's exception turned into the same Error::all on every rank (collectively). The
// experts' grid (Megatron's order tp-ep-dp-pp) against its formula for every (tp, pp, ep, etp),
// and the MoE token exchange (moe_exchange + alltoallv) at uneven loads, with an expert that
// receives nothing and a rank that sends nothing: every row arrives grouped by (local expert,
// source rank), and the way back is the identity.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/agreement.hpp"
#include "comm/topology.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "ops/moe.hpp"

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

TEST(Topology, ContextParallelRankOrderAndGroups) {
  // Megatron's order tp-cp-dp-pp: world 8 = tp 2 x cp 2 x dp 2 (pp 1)
  for (int g = 0; g < 8; ++g) {
    const RankCoords c = Topology::coords_of(g, 2, 2, 1, 2);
    EXPECT_EQ(c.tp, g % 2);
    EXPECT_EQ(c.cp, (g / 2) % 2);
    EXPECT_EQ(c.dp, g / 4);
    EXPECT_EQ(Topology::global_of(c, 2, 2, 1, 2), g);
  }
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int tp = 1; tp <= world; ++tp)
    for (int cp = 2; tp * cp <= world; ++cp)
      for (int pp = 1; tp * cp * pp <= world; ++pp) {
        if (world % (tp * cp * pp)) continue;
        Topology t(MPI_COMM_WORLD, tp, pp, cp);
        const int dp = world / (tp * cp * pp);
        EXPECT_EQ(t.dp_size(), dp);
        EXPECT_EQ(t.cp_size(), cp);
        const RankCoords me = t.coords();
        EXPECT_EQ(Topology::global_of(me, tp, dp, pp, cp), rank);
        EXPECT_EQ(t.cp_group().size(), cp);
        EXPECT_EQ(t.cp_group().rank(), me.cp);
        EXPECT_EQ(t.dp_group().size(), dp);
        EXPECT_EQ(t.dp_group().rank(), me.dp);
        EXPECT_EQ(t.dp_cp_group().size(), dp * cp);
        EXPECT_EQ(t.dp_cp_group().rank(), me.cp + me.dp * cp);
        // members: the sum of the global ranks whose other coordinates match mine
        auto want = [&](auto same) {
          double w = 0;
          for (int g = 0; g < world; ++g)
            if (same(Topology::coords_of(g, tp, dp, pp, cp))) w += g;
          return w;
        };
        const double r = rank;
        EXPECT_EQ(t.cp_group().allreduce_sum(r),
                  want([&](const RankCoords& c) { return c.tp == me.tp && c.dp == me.dp && c.pp == me.pp; }));
        EXPECT_EQ(t.dp_group().allreduce_sum(r),
                  want([&](const RankCoords& c) { return c.tp == me.tp && c.cp == me.cp && c.pp == me.pp; }));
        EXPECT_EQ(t.dp_cp_group().allreduce_sum(r),
                  want([&](const RankCoords& c) { return c.tp == me.tp && c.pp == me.pp; }));
        EXPECT_EQ(t.tp_group().allreduce_sum(r),
                  want([&](const RankCoords& c) { return c.cp == me.cp && c.dp == me.dp && c.pp == me.pp; }));
        EXPECT_EQ(t.pp_group().allreduce_sum(r),
                  want([&](const RankCoords& c) { return c.tp == me.tp && c.cp == me.cp && c.dp == me.dp; }));
      }
}

TEST(Topology, ExpertGridMatchesTheFormula) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // the worked example of topology.hpp: tp 2, dp 2, ep 2, etp 1
  for (int g = 0; g < 4; ++g) {
    const ExpertCoords c = Topology::expert_coords_of(g, 4, 2, 1);
    EXPECT_EQ(c.ep, g % 2);
    EXPECT_EQ(c.edp, g / 2);
    EXPECT_EQ(c.etp, 0);
  }
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp) {
      if (world % (tp * pp)) continue;
      const int dp = world / (tp * pp);
      for (int ep = 1; ep <= tp * dp; ++ep)
        for (int etp = 1; ep * etp <= tp * dp; ++etp) {
          if ((tp * dp) % (ep * etp)) continue;
          Topology t(MPI_COMM_WORLD, tp, pp);
          t.set_expert_parallel(ep, etp);
          const ExpertCoords me = t.expert_coords();
          EXPECT_EQ(t.ep_group().size(), ep);
          EXPECT_EQ(t.etp_group().size(), etp);
          EXPECT_EQ(t.edp_group().size(), tp * dp / (ep * etp));
          EXPECT_EQ(t.ep_group().rank(), me.ep);
          EXPECT_EQ(t.edp_group().rank(), me.edp);
          // the members of my groups: the global ranks of my stage whose coordinates match
          auto want_sum = [&](auto same) {
            double w = 0;
            for (int g = 0; g < world; ++g)
              if (Topology::coords_of(g, tp, dp, pp).pp == t.coords().pp &&
                  same(Topology::expert_coords_of(g, tp * dp, ep, etp)))
                w += g;
            return w;
          };
          EXPECT_EQ(t.ep_group().allreduce_sum(static_cast<double>(rank)),
                    want_sum([&](const ExpertCoords& c) { return c.etp == me.etp && c.edp == me.edp; }));
          EXPECT_EQ(t.edp_group().allreduce_sum(static_cast<double>(rank)),
                    want_sum([&](const ExpertCoords& c) { return c.etp == me.etp && c.ep == me.ep; }));
          EXPECT_EQ(t.etp_group().allreduce_sum(static_cast<double>(rank)),
                    want_sum([&](const ExpertCoords& c) { return c.ep == me.ep && c.edp == me.edp; }));
        }
    }
}

TEST(MoeExchange, RowsArriveGroupedByLocalExpertThenSourceAndReturn) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Topology t(MPI_COMM_WORLD, 1, 1);
  t.set_expert_parallel(world, 1);
  const Communicator& ep = t.ep_group();
  const std::int64_t El = 2, E = El * world, C = 3;
  // rank r sends (r + e) % 3 rows to expert e, none at all from rank 0, and expert 1 gets nothing
  std::vector<std::int64_t> sent(static_cast<size_t>(E), 0);
  for (std::int64_t e = 0; e < E; ++e) sent[static_cast<size_t>(e)] = rank == 0 || e == 1 ? 0 : (rank + e) % 3;
  std::vector<std::int64_t> received(static_cast<size_t>(E), 0);
  ep.alltoall(sent.data(), received.data(), El);
  const MoeExchange x = moe_exchange(sent, received, world);
  std::int64_t N = 0;
  for (auto n : sent) N += n;
  // row payload: (source rank, global expert, index within the expert)
  HostFloatView rows("rows", static_cast<size_t>(std::max<std::int64_t>(1, N * C)));
  std::int64_t at = 0;
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t i = 0; i < sent[static_cast<size_t>(e)]; ++i, ++at) {
      rows(at * C) = static_cast<float>(rank);
      rows(at * C + 1) = static_cast<float>(e);
      rows(at * C + 2) = static_cast<float>(i);
    }
  const std::int64_t M = x.rows();
  FloatView send = make_float("send", std::max<std::int64_t>(1, N * C)),
            recv = make_float("recv", std::max<std::int64_t>(1, M * C)),
            grouped = make_float("grouped", std::max<std::int64_t>(1, M * C)),
            back = make_float("back", std::max<std::int64_t>(1, N * C));
  Kokkos::deep_copy(send, rows);
  ep.alltoallv(send.data(), x.send_rows, recv.data(), x.recv_rows, C * 4);
  IntView regroup = make_int("regroup", std::max<std::int64_t>(1, M)),
          inverse = make_int("inverse", std::max<std::int64_t>(1, M));
  {
    HostIntView rg("rg", regroup.extent(0)), inv("inv", inverse.extent(0));
    for (std::int64_t m = 0; m < M; ++m) {
      rg(m) = x.regroup[static_cast<size_t>(m)];
      inv(m) = x.inverse[static_cast<size_t>(m)];
    }
    Kokkos::deep_copy(regroup, rg);
    Kokkos::deep_copy(inverse, inv);
  }
  moe_gather(act(grouped), act(recv), regroup, M, C);
  Kokkos::fence();
  auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grouped);
  // expected: for each local expert j, for each source r, the rows r sent to expert rank*El + j
  std::int64_t m = 0;
  for (std::int64_t j = 0; j < El; ++j) {
    const std::int64_t e = rank * El + j;
    EXPECT_EQ(x.offsets[static_cast<size_t>(j)], m);
    for (int r = 0; r < world; ++r) {
      const std::int64_t n = r == 0 || e == 1 ? 0 : (r + e) % 3;
      EXPECT_EQ(received[static_cast<size_t>(r * El + j)], n);
      for (std::int64_t i = 0; i < n; ++i, ++m) {
        EXPECT_EQ(g(m * C), static_cast<float>(r));
        EXPECT_EQ(g(m * C + 1), static_cast<float>(e));
        EXPECT_EQ(g(m * C + 2), static_cast<float>(i));
      }
    }
  }
  EXPECT_EQ(m, M);
  // the way back: regrouped to source order, exchanged again, the rows sent
  FloatView xfer = make_float("xfer", std::max<std::int64_t>(1, M * C));
  moe_gather(act(xfer), act(grouped), inverse, M, C);
  Kokkos::fence();
  ep.alltoallv(xfer.data(), x.recv_rows, back.data(), x.send_rows, C * 4);
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  for (std::int64_t i = 0; i < N * C; ++i) EXPECT_EQ(b(i), rows(i));
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
