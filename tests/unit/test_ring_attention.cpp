// Ring attention's block kernels (ops/ring_attention) without communication: the blocks every
// context-parallel rank would receive are handed to it in ring order, and the merged result is
// compared with the fused kernel over the whole sequence, forward and backward, at cp 1 to 4
// with odd chunk sizes, grouped-query attention, packed documents (rows whose block holds no key
// they may attend to: the merge must leave them alone), dropout, and bf16 storage; the backward
// pass against finite differences; and the zig-zag chunk assignment's balance of unmasked
// query-key pairs.
#include <cmath>
#include <cstdio>

#include "common/half.hpp"
#include "ops/flash_attention.hpp"
#include "ops/ring_attention.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

namespace {

struct RingCase {
  std::int64_t B, c, C, nh, ng, cp;  // batch, chunk length, channels, heads, key/value groups, ranks
  float drop = 0.f;
  bool docs = false;
  DType dt = DType::F32;
};

// Global row index of local row t of rank r (ops/ring_attention.hpp's zig-zag split).
std::int64_t global_row(const CpChunks& cc, std::int64_t b, std::int64_t r, std::int64_t t) {
  return b * cc.T() + cc.global(r, t);
}

Act to_act(const std::vector<float>& v, DType dt) {
  if (dt == DType::F32) return act(to_device(v));
  Act a = make_act(dt, "act16", static_cast<std::int64_t>(v.size()));
  auto h = Kokkos::create_mirror_view(a.h);
  for (size_t i = 0; i < v.size(); ++i) h(i) = dt == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
  Kokkos::deep_copy(a.h, h);
  return a;
}

std::vector<float> act_to_host(const Act& a) {
  if (!a.is_half()) return to_host(a.f);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.h);
  std::vector<float> v(h.extent(0));
  for (size_t i = 0; i < v.size(); ++i) v[i] = a.dt == DType::BF16 ? bf16_to_float(h(i)) : fp16_to_float(h(i));
  return v;
}

struct RingResult {
  std::vector<float> y, lse, dqkv;  // in the whole sequence's row order
};

// The ring's result over every rank, reassembled in global row order.
RingResult run_ring(const RingCase& k, const std::vector<float>& qkv_full, const std::vector<float>& dy_full,
                    const std::vector<std::int32_t>& doc_full) {
  const std::int64_t Tl = 2 * k.c, T = Tl * k.cp, hs = k.C / k.nh, Ckv = k.ng * hs, W = k.C + 2 * Ckv;
  const CpChunks cc{k.cp, Tl};
  const AttentionShape s{k.B, Tl, k.C, k.nh, 0, 0, k.ng};
  DropoutSpec d;
  d.p = k.drop;
  d.key = 424242;
  std::vector<Act> qkv(k.cp), packed(k.cp), y(k.cp);
  std::vector<FloatView> lse(k.cp), acc(k.cp), dqkv(k.cp), dkv(k.cp), delta(k.cp), dy(k.cp);
  std::vector<AttentionMask> mask(k.cp);
  for (std::int64_t r = 0; r < k.cp; ++r) {
    std::vector<float> q(static_cast<size_t>(k.B * Tl * W)), g(static_cast<size_t>(k.B * Tl * k.C));
    std::vector<std::int32_t> doc(static_cast<size_t>(k.B * Tl));
    for (std::int64_t b = 0; b < k.B; ++b)
      for (std::int64_t t = 0; t < Tl; ++t) {
        const std::int64_t gr = global_row(cc, b, r, t), lr = b * Tl + t;
        for (std::int64_t e = 0; e < W; ++e) q[lr * W + e] = qkv_full[gr * W + e];
        for (std::int64_t e = 0; e < k.C; ++e) g[lr * k.C + e] = dy_full[gr * k.C + e];
        if (k.docs) doc[lr] = doc_full[gr];
      }
    qkv[r] = to_act(q, k.dt);
    dy[r] = to_device(g);
    if (k.docs) mask[r].doc_start = to_device(doc);
    packed[r] = make_act(k.dt, "packed", k.B * Tl * 2 * Ckv);
    ring_pack_kv(packed[r], qkv[r], s);
    y[r] = make_act(k.dt, "y", k.B * Tl * k.C);
    lse[r] = make_float("lse", k.B * k.nh * Tl);
    acc[r] = make_float("acc", k.B * Tl * k.C);
    dqkv[r] = make_float("dqkv", k.B * Tl * W);
    dkv[r] = make_float("dkv", k.B * Tl * 2 * Ckv);
    delta[r] = make_float("delta", k.B * k.nh * Tl);
  }
  // forward: rank r sees the blocks of r, r - 1, ..., r - cp + 1 (the ring's order)
  for (std::int64_t r = 0; r < k.cp; ++r) {
    ring_forward_begin(acc[r], lse[r], s);
    for (std::int64_t step = 0; step < k.cp; ++step) {
      const std::int64_t owner = (r - step + k.cp) % k.cp;
      ring_forward_block(acc[r], lse[r], qkv[r], KvBlock{packed[owner], 2 * Ckv, 0, Ckv, owner}, r, cc, s, d, mask[r]);
    }
    ring_forward_end(y[r], acc[r], s);
  }
  // backward: every rank's queries against every block, the blocks' gradients gathered per owner
  for (std::int64_t r = 0; r < k.cp; ++r) {
    ring_backward_begin(dqkv[r], delta[r], dy[r], y[r], s);
    Kokkos::deep_copy(dkv[r], 0.f);
  }
  for (std::int64_t r = 0; r < k.cp; ++r)
    for (std::int64_t step = 0; step < k.cp; ++step) {
      const std::int64_t owner = (r - step + k.cp) % k.cp;
      ring_backward_block(dqkv[r], dkv[owner], dy[r], qkv[r], KvBlock{packed[owner], 2 * Ckv, 0, Ckv, owner}, lse[r],
                          delta[r], r, cc, s, d, mask[r]);
    }
  for (std::int64_t r = 0; r < k.cp; ++r) ring_backward_end(dqkv[r], dkv[r], s);
  RingResult out;
  out.y.resize(static_cast<size_t>(k.B * T * k.C));
  out.lse.resize(static_cast<size_t>(k.B * k.nh * T));
  out.dqkv.resize(static_cast<size_t>(k.B * T * W));
  for (std::int64_t r = 0; r < k.cp; ++r) {
    const auto yh = act_to_host(y[r]), lh = to_host(lse[r]), gh = to_host(dqkv[r]);
    for (std::int64_t b = 0; b < k.B; ++b)
      for (std::int64_t t = 0; t < Tl; ++t) {
        const std::int64_t gr = global_row(cc, b, r, t), lr = b * Tl + t;
        for (std::int64_t e = 0; e < k.C; ++e) out.y[gr * k.C + e] = yh[lr * k.C + e];
        for (std::int64_t e = 0; e < W; ++e) out.dqkv[gr * W + e] = gh[lr * W + e];
        for (std::int64_t h = 0; h < k.nh; ++h)
          out.lse[(b * k.nh + h) * T + cc.global(r, t)] = lh[(b * k.nh + h) * Tl + t];
      }
  }
  return out;
}

// documents of lengths 5, 1, 7, ... restarting per sample: the first global position of each row's
std::vector<std::int32_t> doc_starts(std::int64_t B, std::int64_t T) {
  std::vector<std::int32_t> v(static_cast<size_t>(B * T));
  const int lengths[] = {5, 1, 7, 3, 11, 2};
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t start = 0, next = 0, i = static_cast<std::int64_t>(b);
    for (std::int64_t t = 0; t < T; ++t) {
      if (t == next) {
        start = t;
        next = t + lengths[i++ % 6];
      }
      v[static_cast<size_t>(b * T + t)] = static_cast<std::int32_t>(start);
    }
  }
  return v;
}

void compare_with_flash(const RingCase& k, double rtol, double atol) {
  const std::int64_t T = 2 * k.c * k.cp, hs = k.C / k.nh, W = k.C + 2 * k.ng * hs;
  const AttentionShape full{k.B, T, k.C, k.nh, 0, 0, k.ng};
  auto qkv_h = random_vector(k.B * T * W, 71), dy_h = random_vector(k.B * T * k.C, 72);
  if (k.dt != DType::F32)  // the inputs as 16-bit words hold them, so both paths read the same values
    qkv_h = act_to_host(to_act(qkv_h, k.dt));
  const std::vector<std::int32_t> docs = k.docs ? doc_starts(k.B, T) : std::vector<std::int32_t>{};
  DropoutSpec d;
  d.p = k.drop;
  d.key = 424242;
  AttentionMask mask;
  if (k.docs) mask.doc_start = to_device(docs);
  Act y = make_act(k.dt, "y", k.B * T * k.C), q = to_act(qkv_h, k.dt);
  FloatView lse = make_float("lse", k.B * k.nh * T), delta = make_float("delta", k.B * k.nh * T);
  FloatView dqkv = make_float("dqkv", k.B * T * W);
  flash_attention_forward(y, lse, q, full, d, mask);
  flash_attention_backward(dqkv, to_device(dy_h), q, y, lse, delta, full, d, mask);
  const RingResult ring = run_ring(k, qkv_h, dy_h, docs);
  char what[160];
  std::snprintf(what, sizeof(what), "cp %lld, chunk %lld, GQA %lld/%lld, dropout %.2f, docs %d, dtype %d",
                static_cast<long long>(k.cp), static_cast<long long>(k.c), static_cast<long long>(k.nh),
                static_cast<long long>(k.ng), k.drop, static_cast<int>(k.docs), static_cast<int>(k.dt));
  expect_close(as_double(ring.y), as_double(act_to_host(y)), rtol, atol,
               (std::string("ring forward, ") + what).c_str());
  expect_close(as_double(ring.lse), as_double(to_host(lse)), 1e-5, 1e-5, (std::string("ring lse, ") + what).c_str());
  expect_close(as_double(ring.dqkv), as_double(to_host(dqkv)), rtol, 10 * atol,
               (std::string("ring backward, ") + what).c_str());
}

}  // namespace

// The merged blocks equal attention over the whole sequence: the fused kernel adds the same terms
// in another order (per block, rescaled at the merge), so differences are a few fp32 ulps.
TEST(RingAttention, MergedBlocksEqualFullAttention) {
  for (std::int64_t cp : {1, 2, 3, 4})
    for (std::int64_t c : {1, 3, 5}) compare_with_flash({2, c, 16, 4, 2, cp}, 2e-5, 2e-6);
}

TEST(RingAttention, PackedDocumentsAndDropoutKeepTheOneRankMasks) {
  for (std::int64_t cp : {2, 4}) {
    compare_with_flash({2, 3, 16, 4, 4, cp, 0.f, true}, 2e-5, 2e-6);
    compare_with_flash({2, 3, 16, 4, 2, cp, 0.25f, false}, 2e-5, 2e-6);
    compare_with_flash({1, 5, 24, 3, 1, cp, 0.1f, true}, 2e-5, 2e-6);
  }
}

// 16-bit blocks: both paths read the same 16-bit words; the outputs are rounded once to 16 bits
// (one rounding apart at most where the fp32 sums differ in their last bits).
TEST(RingAttention, SixteenBitStorage) {
  compare_with_flash({2, 3, 16, 4, 2, 2, 0.f, false, DType::BF16}, 8e-3, 1e-3);
  compare_with_flash({2, 3, 16, 4, 2, 3, 0.1f, true, DType::F16}, 1e-3, 1e-4);
}

// The backward pass against central differences of sum(R * y) through the whole ring.
TEST(RingAttention, BackwardMatchesFiniteDifferences) {
  const RingCase k{1, 2, 8, 2, 1, 3};
  const std::int64_t T = 2 * k.c * k.cp, hs = k.C / k.nh, W = k.C + 2 * k.ng * hs;
  auto qkv_h = random_vector(k.B * T * W, 81), R = random_vector(k.B * T * k.C, 82);
  const auto docs = doc_starts(k.B, T);
  const RingResult g = run_ring(k, qkv_h, R, docs);
  auto loss = [&] {
    const RingResult r = run_ring(k, qkv_h, R, docs);
    return dot(r.y, R);
  };
  std::vector<size_t> idx;
  for (size_t i = 0; i < qkv_h.size(); i += 5) idx.push_back(i);
  std::vector<double> got;
  for (auto i : idx) got.push_back(g.dqkv[i]);
  expect_close(got, numeric_gradient(qkv_h, loss, idx), 2e-3, 2e-3, "ring backward vs finite differences");
}

// The zig-zag assignment gives every rank the same number of unmasked (causal) query-key pairs;
// a contiguous split gives the last rank about 2 cp - 1 times the first's.
TEST(RingAttention, ChunkAssignmentBalancesCausalWork) {
  for (std::int64_t cp : {2, 4, 8})
    for (std::int64_t c : {1, 4, 7}) {
      const CpChunks cc{cp, 2 * c};
      std::vector<std::int64_t> pairs(static_cast<size_t>(cp), 0), contiguous(static_cast<size_t>(cp), 0);
      for (std::int64_t r = 0; r < cp; ++r)
        for (std::int64_t t = 0; t < 2 * c; ++t) {
          pairs[static_cast<size_t>(r)] += cc.global(r, t) + 1;  // keys 0 .. its position
          contiguous[static_cast<size_t>(r)] += r * 2 * c + t + 1;
        }
      std::printf("cp %lld, chunk %lld: unmasked pairs per rank zig-zag", static_cast<long long>(cp),
                  static_cast<long long>(c));
      for (auto p : pairs) std::printf(" %lld", static_cast<long long>(p));
      std::printf(" | contiguous");
      for (auto p : contiguous) std::printf(" %lld", static_cast<long long>(p));
      std::printf("\n");
      for (std::int64_t r = 1; r < cp; ++r) {
        // within one chunk's worth of pairs (c^2); the zig-zag split is in fact exact
        EXPECT_LE(std::llabs(pairs[static_cast<size_t>(r)] - pairs[0]), c * c);
        EXPECT_EQ(pairs[static_cast<size_t>(r)], pairs[0]);
      }
      // every position exactly once
      std::vector<int> seen(static_cast<size_t>(cp * 2 * c), 0);
      for (std::int64_t r = 0; r < cp; ++r)
        for (std::int64_t t = 0; t < 2 * c; ++t) ++seen[static_cast<size_t>(cc.global(r, t))];
      for (int v : seen) EXPECT_EQ(v, 1);
    }
}
