// Topology and collective error agreement under MPI (run with np = 2 and 4): Megatron's rank
// order on the worked example of topology.hpp, the context-parallel order tp-cp-dp-pp and its
// groups (cp, dp, dp x cp, tp, pp) against the formula, group sizes and members against the formula for
// every (tp, pp) that divides the world, an error on every rank for sizes that do not divide,
// and one rank's exception turned into the same Error::all on every rank (collectively). The
// experts' grid (Megatron's order tp-ep-dp-pp) against its formula for every (tp, pp, ep, etp),
// and the MoE token exchange (moe_exchange + alltoallv) at uneven loads, with an expert that
// receives nothing and a rank that sends nothing: every row arrives grouped by (local expert,
// source rank), and the way back is the identity. Every collective of the communicator gives the
// same bytes under both MPI wait policies (spin: blocking calls; yield: nonblocking calls tested
// with the core given up), and the automatic policy yields exactly when a node has more ranks
// than CPUs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "comm/agreement.hpp"
#include "comm/mpi_job.hpp"
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

namespace {
// Every collective of Communicator on data that differs by rank, under the current wait policy.
struct Results {
  std::vector<unsigned char> exact;  // data movement, max / min, integer sums: the bytes
  std::vector<double> sums;          // floating-point sums (their order of addition is MPI's)
};
Results run_every_collective(const Communicator& c) {
  const int p = c.size(), me = c.rank();
  std::mt19937 gen(1234 + static_cast<unsigned>(me));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Results out;
  auto keep = [&](const void* data, std::size_t bytes) {
    const auto* b = static_cast<const unsigned char*>(data);
    out.exact.insert(out.exact.end(), b, b + bytes);
  };
  auto sums = [&](const float* data, std::int64_t n) { out.sums.insert(out.sums.end(), data, data + n); };
  // sizes across MPICH's algorithm switches (a reduce-scatter's 512 KiB, an all-reduce's 2 KiB)
  for (std::int64_t n : {1, 37, 4096, 100003}) {
    std::vector<float> a(static_cast<std::size_t>(n * p));
    for (auto& x : a) x = u(gen) * static_cast<float>(1 + me);
    std::vector<float> b = a;
    c.allreduce_sum(b.data(), n);
    sums(b.data(), n);
    b = a;
    c.allreduce_max(b.data(), n);
    keep(b.data(), 4 * n);
    std::vector<float> part(static_cast<std::size_t>(n));
    c.reduce_scatter(a.data(), part.data(), n);
    sums(part.data(), n);
    b = a;
    c.reduce_scatter_in_place(b.data(), n);
    sums(b.data() + me * n, n);
    std::vector<float> all(static_cast<std::size_t>(n * p));
    c.allgather(a.data(), all.data(), n);
    keep(all.data(), all.size() * 4);
    b = a;
    c.allgather_in_place(b.data(), n);
    keep(b.data(), b.size() * 4);
    std::vector<std::uint16_t> h(static_cast<std::size_t>(n * p)), hall(h.size());
    for (auto& x : h) x = static_cast<std::uint16_t>(gen());
    c.allgather(h.data(), hall.data(), n);
    keep(hall.data(), hall.size() * 2);
    c.allgather_in_place(h.data(), n);
    keep(h.data(), h.size() * 2);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) counts[r] = n + r;
    std::vector<float> big(static_cast<std::size_t>(n * p + p * (p - 1) / 2));
    for (auto& x : big) x = u(gen);
    std::vector<float> v(static_cast<std::size_t>(counts[me]));
    c.reduce_scatter_v(big.data(), v.data(), counts);
    sums(v.data(), counts[me]);
    b = a;
    std::vector<MPI_Request> reqs{c.iallreduce_sum(b.data(), n)};
    Communicator::wait_all(reqs);
    sums(b.data(), n);
    b = a;
    MPI_Request r = c.ireduce_sum(b.data(), n, p - 1);
    Communicator::wait(r);
    if (me == p - 1) sums(b.data(), n);
  }
  out.sums.push_back(c.allreduce_sum(0.1 * (me + 1)));
  const double d = c.allreduce_max(0.5 * me) + c.allreduce_min(-0.25 * me);
  keep(&d, sizeof d);
  const std::int64_t i = c.allreduce_sum(std::int64_t{me}) + c.allreduce_min(std::int64_t{me} - 3) +
                         c.exscan_sum(me + 1);
  keep(&i, sizeof i);
  std::vector<std::int64_t> send(static_cast<std::size_t>(2 * p)), recv(send.size());
  for (int k = 0; k < 2 * p; ++k) send[k] = 100 * me + k;
  c.alltoall(send.data(), recv.data(), 2);
  keep(recv.data(), recv.size() * 8);
  // rows of 12 bytes, rank m sending m + k + 1 rows to rank k
  std::vector<std::int64_t> srows(static_cast<std::size_t>(p)), rrows(srows.size());
  std::int64_t stot = 0, rtot = 0;
  for (int k = 0; k < p; ++k) stot += srows[k] = me + k + 1;
  for (int k = 0; k < p; ++k) rtot += rrows[k] = k + me + 1;
  std::vector<unsigned char> sb(static_cast<std::size_t>(12 * stot)), rb(static_cast<std::size_t>(12 * rtot));
  for (auto& x : sb) x = static_cast<unsigned char>(gen());
  c.alltoallv(sb.data(), srows, rb.data(), rrows, 12);
  keep(rb.data(), rb.size());
  std::vector<std::int64_t> grows(static_cast<std::size_t>(p));
  std::int64_t gtot = 0;
  for (int k = 0; k < p; ++k) gtot += grows[k] = k + 1;
  std::vector<unsigned char> gb(static_cast<std::size_t>(12 * gtot));
  c.allgatherv(sb.data(), gb.data(), grows, 12);
  keep(gb.data(), gb.size());
  std::vector<std::int32_t> i32(static_cast<std::size_t>(3 * p));
  const std::int32_t mine3[3] = {me, -me, 7};
  c.allgather(mine3, i32.data(), 3);
  keep(i32.data(), i32.size() * 4);
  const std::string text = c.broadcast_text(me == 0 ? std::string("from rank 0") : std::string());
  keep(text.data(), text.size());
  for (const auto& t : c.allgather_text(std::string(static_cast<std::size_t>(me + 1), 'x'))) keep(t.data(), t.size());
  const std::vector<double> g = c.gatherv_to_root(std::vector<double>(static_cast<std::size_t>(me + 1), me));
  keep(g.data(), g.size() * 8);
  // point to point: a ring of single and grouped messages
  if (p > 1) {
    std::vector<float> ring_out(64, static_cast<float>(me)), ring_in(64);
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    MPI_Request sr = c.isend(ring_out.data(), 64, next, 5);
    c.recv(ring_in.data(), 64, prev, 5);
    Communicator::wait(sr);
    keep(ring_in.data(), ring_in.size() * 4);
    c.p2p_group({{true, ring_out.data(), 64, next, 6}, {false, ring_in.data(), 64, prev, 6}});
    keep(ring_in.data(), ring_in.size() * 4);
  }
  c.barrier();
  return out;
}
}  // namespace

TEST(Communicator, BothWaitPoliciesGiveTheSameResults) {
  const Communicator world = Communicator::duplicate(MPI_COMM_WORLD);
  const mpi_job::WaitPolicy chosen = mpi_job::wait_policy();
  mpi_job::set_wait_policy(mpi_job::WaitPolicy::spin);
  const Results spin = run_every_collective(world);
  mpi_job::set_wait_policy(mpi_job::WaitPolicy::yield);
  const Results yield = run_every_collective(world);
  mpi_job::set_wait_policy(chosen);
  // everything but floating-point sums is the same bytes
  ASSERT_EQ(spin.exact.size(), yield.exact.size());
  std::size_t first = 0;
  while (first < spin.exact.size() && spin.exact[first] == yield.exact[first]) ++first;
  EXPECT_EQ(first, spin.exact.size()) << "the first byte that differs";
  // floating-point sums: the same bits over 2 ranks (x0 + x1 in any order); over more ranks MPI's
  // nonblocking algorithms may add in another order (MPICH: reduce-scatters of 512 KiB to 2 MiB),
  // which moves the last bits only
  ASSERT_EQ(spin.sums.size(), yield.sums.size());
  // (p - 1 roundings of partial sums bounded by the sum of the magnitudes, at most 1 + 2 + ... + p
  // here: a few float ulps of that)
  std::size_t differ = 0;
  double worst = 0;
  for (std::size_t k = 0; k < spin.sums.size(); ++k) {
    differ += spin.sums[k] != yield.sums[k];
    worst = std::max(worst, std::abs(spin.sums[k] - yield.sums[k]));
  }
  const int p = world.size(), me = world.rank();
  if (p == 2) EXPECT_EQ(differ, 0u);
  EXPECT_LE(worst, (p - 1) * 0.5 * p * (p + 1) * 1.2e-7) << differ << " of " << spin.sums.size() << " sums differ";
  // and the results are right where they are exact: the sum of the ranks, the prefix sums
  EXPECT_EQ(world.allreduce_sum(std::int64_t{me}), std::int64_t{p} * (p - 1) / 2);
  EXPECT_EQ(world.exscan_sum(me + 1), std::int64_t{me} * (me + 1) / 2);
}

TEST(Communicator, AutomaticWaitPolicyYieldsWhenRanksOutnumberCpus) {
  const mpi_job::WaitChoice w = mpi_job::choose_wait_policy("auto");
  EXPECT_GE(w.node_cpus, 1);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  EXPECT_EQ(w.node_ranks, world);  // the test runs on one node
  EXPECT_EQ(w.oversubscribed, w.node_ranks > w.node_cpus);
  EXPECT_EQ(w.policy, w.oversubscribed ? mpi_job::WaitPolicy::yield : mpi_job::WaitPolicy::spin);
  EXPECT_EQ(mpi_job::choose_wait_policy("spin").policy, mpi_job::WaitPolicy::spin);
  EXPECT_EQ(mpi_job::choose_wait_policy("yield").policy, mpi_job::WaitPolicy::yield);
  EXPECT_NE(mpi_job::describe_wait_choice().find("parallel.mpi_wait = yield"), std::string::npos);
  // TRIDENT_MPI_WAIT is auto's value where it is set; a deck's explicit setting wins
  setenv("TRIDENT_MPI_WAIT", "yield", 1);
  EXPECT_EQ(mpi_job::choose_wait_policy("auto").policy, mpi_job::WaitPolicy::yield);
  EXPECT_NE(mpi_job::describe_wait_choice().find("TRIDENT_MPI_WAIT=yield"), std::string::npos);
  EXPECT_EQ(mpi_job::choose_wait_policy("spin").policy, mpi_job::WaitPolicy::spin);
  setenv("TRIDENT_MPI_WAIT", "spin", 1);
  EXPECT_EQ(mpi_job::choose_wait_policy("auto").policy, mpi_job::WaitPolicy::spin);
  unsetenv("TRIDENT_MPI_WAIT");
  try {
    mpi_job::choose_wait_policy("sometimes");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, spin or yield"), std::string::npos) << e.what();
  }
  mpi_job::choose_wait_policy("auto");
}
