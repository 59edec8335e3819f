// Ring attention block kernels (ops/ring_attention.hpp): one thread per query row for the forward
// block and for dq, one thread per key row of the block for its dk and dv, as the fused attention
// kernels are laid out; each thread adds its terms in a fixed order, so the results do not depend
// on the thread count.
#include "ops/ring_attention.hpp"

#include <sstream>

#include "common/device_math.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "ops/flash_attention.hpp"

namespace trident {
namespace {

constexpr float kNoKey = -3.0e38f;  // the log-sum-exp of a row without any key yet

struct RingParams {
  RingParams(const AttentionShape& s, const KvBlock& kv, std::int64_t q_rank, const CpChunks& cc,
             const DropoutSpec& drop, const AttentionMask& mask)
      : Tl(s.T), C(s.C), nh(s.nh), hs(s.hs()), rep(s.rep()), ldq(s.C + 2 * s.kv_C()), ldk(kv.ld), koff(kv.koff),
        voff(kv.voff), cc(cc), qr(q_rank), kr(kv.rank), scale(1.f / dsqrt(static_cast<float>(s.hs()))),
        docs(mask.doc_start.extent(0) > 0), doc(mask.doc_start), dropping(drop.active()), pdrop(drop.p),
        keep_scale(drop.active() ? 1.f / (1.f - drop.p) : 1.f), key(drop.key) {}
  std::int64_t Tl, C, nh, hs, rep, ldq, ldk, koff, voff;
  CpChunks cc;
  std::int64_t qr, kr;  // the ranks of the queries and of the key/value block
  float scale;
  bool docs;
  IntView doc;  // (B * Tl) a query's first attended global position, when docs
  bool dropping;
  float pdrop, keep_scale;
  std::uint64_t key;
  KOKKOS_INLINE_FUNCTION std::int64_t q_at(std::int64_t row, std::int64_t h) const { return row * ldq + h * hs; }
  KOKKOS_INLINE_FUNCTION std::int64_t k_at(std::int64_t row, std::int64_t h) const {
    return row * ldk + koff + (h / rep) * hs;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t v_at(std::int64_t row, std::int64_t h) const {
    return row * ldk + voff + (h / rep) * hs;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t first_key(std::int64_t b, std::int64_t i) const {
    return docs ? static_cast<std::int64_t>(doc(b * Tl + i)) : 0;
  }
  // The local key rows [*j0, *j1) of half `half` of the block that a query at global position gi
  // (first attended position lo) attends to.
  KOKKOS_INLINE_FUNCTION void key_range(std::int64_t half, std::int64_t gi, std::int64_t lo, std::int64_t* j0,
                                        std::int64_t* j1) const {
    const std::int64_t c = cc.chunk(), base = cc.chunk_of(kr, half) * c;  // global position of the half's row 0
    std::int64_t a = lo - base, e = gi - base + 1;
    if (a < 0) a = 0;
    if (e > c) e = c;
    *j0 = half * c + a;
    *j1 = e > a ? half * c + e : half * c + a;
  }
  // The local query rows [*i0, *i1) of half `half` whose global positions are >= gj.
  KOKKOS_INLINE_FUNCTION void query_range(std::int64_t half, std::int64_t gj, std::int64_t* i0,
                                          std::int64_t* i1) const {
    const std::int64_t c = cc.chunk(), base = cc.chunk_of(qr, half) * c;
    std::int64_t a = gj - base;
    if (a < 0) a = 0;
    if (a > c) a = c;
    *i0 = half * c + a;
    *i1 = (half + 1) * c;
  }
  // the dropout counter of element (b, h, gi, gj) of a one-rank run's (B, nh, T, T) probabilities
  KOKKOS_INLINE_FUNCTION std::uint64_t drop_index(std::int64_t b, std::int64_t h, std::int64_t gi,
                                                  std::int64_t gj) const {
    const std::int64_t T = cc.T();
    return static_cast<std::uint64_t>(((b * nh + h) * T + gi) * T + gj);
  }
};

template <class F, class V>
void pack_kv(const V& packed, const V& qkv, const AttentionShape& s) {
  const std::int64_t C = s.C, W = 2 * s.kv_C(), ld = C + W;
  for_each_element(
      "ops::ring_pack_kv", s.B * s.T, W,
      KOKKOS_LAMBDA(std::int64_t e, std::int64_t c) { packed(e) = qkv((e / W) * ld + C + c); });
}

template <class F, class V>
void forward_block(const FloatView& acc, const FloatView& lse, const V& qkv, const V& kv, const RingParams P,
                   std::int64_t B) {
  for_each_index(
      "ops::ring_attention_forward_block", B * P.nh * P.Tl, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (P.nh * P.Tl), h = (r / P.Tl) % P.nh, i = r % P.Tl;
        const std::int64_t gi = P.cc.global(P.qr, i), lo = P.first_key(b, i);
        float q[kFlashMaxHeadDim], o[kFlashMaxHeadDim];
        const std::int64_t qo = P.q_at(b * P.Tl + i, h);
        for (std::int64_t c = 0; c < P.hs; ++c) {
          q[c] = F::load(qkv(qo + c)) * P.scale;
          o[c] = 0.f;
        }
        float m = kNoKey, l = 0.f;
        for (std::int64_t half = 0; half < 2; ++half) {
          std::int64_t j0, j1;
          P.key_range(half, gi, lo, &j0, &j1);
          for (std::int64_t j = j0; j < j1; ++j) {
            const std::int64_t ko = P.k_at(b * P.Tl + j, h), vo = P.v_at(b * P.Tl + j, h);
            float sc = 0.f;
            for (std::int64_t c = 0; c < P.hs; ++c) sc += q[c] * F::load(kv(ko + c));
            if (sc > m) {
              const float corr = fast_exp(m - sc);
              l *= corr;
              for (std::int64_t c = 0; c < P.hs; ++c) o[c] *= corr;
              m = sc;
            }
            const float p = fast_exp(sc - m);
            l += p;
            float pd = p;
            if (P.dropping) {
              const std::int64_t gj = P.cc.global(P.kr, j);
              pd = dropout_uniform(P.key, P.drop_index(b, h, gi, gj)) >= P.pdrop ? p * P.keep_scale : 0.f;
            }
            if (pd != 0.f)
              for (std::int64_t c = 0; c < P.hs; ++c) o[c] += pd * F::load(kv(vo + c));
          }
        }
        if (!(l > 0.f)) return;  // no key of this block: acc and lse stay
        // merge: acc <- acc e^(L - L') + (o / l) e^(m + log l - L'), L' = log(e^L + l e^m)
        const float L = lse(r), Lb = m + dlog(l);
        const float Ln = L > Lb ? L + dlog(1.f + fast_exp(Lb - L)) : Lb + dlog(1.f + fast_exp(L - Lb));
        const float wa = L > kNoKey ? fast_exp(L - Ln) : 0.f, wb = fast_exp(m - Ln);
        const std::int64_t yo = (b * P.Tl + i) * P.C + h * P.hs;
        for (std::int64_t c = 0; c < P.hs; ++c) acc(yo + c) = acc(yo + c) * wa + o[c] * wb;
        lse(r) = Ln;
      });
}

template <class F, class V>
void backward_block(const FloatView& dqkv, const FloatView& dkv, const FloatView& dy, const V& qkv, const V& kv,
                    const FloatView& lse, const FloatView& delta, const RingParams P, std::int64_t B) {
  // this rank's queries: dq_i += scale sum_j dS_ij k_j over the block's keys
  for_each_index(
      "ops::ring_attention_backward_dq", B * P.nh * P.Tl, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (P.nh * P.Tl), h = (r / P.Tl) % P.nh, i = r % P.Tl;
        const float L = lse(r), D = delta(r);
        if (!(L > kNoKey)) return;
        const std::int64_t gi = P.cc.global(P.qr, i), lo = P.first_key(b, i);
        const std::int64_t qo = P.q_at(b * P.Tl + i, h), yo = (b * P.Tl + i) * P.C + h * P.hs;
        float q[kFlashMaxHeadDim], g[kFlashMaxHeadDim], dq[kFlashMaxHeadDim];
        for (std::int64_t c = 0; c < P.hs; ++c) {
          q[c] = F::load(qkv(qo + c)) * P.scale;
          g[c] = dy(yo + c);
          dq[c] = 0.f;
        }
        for (std::int64_t half = 0; half < 2; ++half) {
          std::int64_t j0, j1;
          P.key_range(half, gi, lo, &j0, &j1);
          for (std::int64_t j = j0; j < j1; ++j) {
            const std::int64_t ko = P.k_at(b * P.Tl + j, h), vo = P.v_at(b * P.Tl + j, h);
            float sc = 0.f, dp = 0.f;
            for (std::int64_t c = 0; c < P.hs; ++c) {
              sc += q[c] * F::load(kv(ko + c));
              dp += g[c] * F::load(kv(vo + c));
            }
            const float p = fast_exp(sc - L);
            if (P.dropping)
              dp = dropout_uniform(P.key, P.drop_index(b, h, gi, P.cc.global(P.kr, j))) >= P.pdrop ? dp * P.keep_scale
                                                                                                   : 0.f;
            const float ds = p * (dp - D) * P.scale;
            for (std::int64_t c = 0; c < P.hs; ++c) dq[c] += ds * F::load(kv(ko + c));
          }
        }
        for (std::int64_t c = 0; c < P.hs; ++c) dqkv(qo + c) += dq[c];
      });
  // the block's keys and values, one thread per key row and group: summed over the group's query
  // heads and this rank's queries, added into the travelling dkv (B * Tl, 2 Ckv)
  const std::int64_t ngr = P.nh / P.rep, Ckv = ngr * P.hs;
  for_each_index(
      "ops::ring_attention_backward_dkv", B * ngr * P.Tl, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (ngr * P.Tl), grp = (r / P.Tl) % ngr, j = r % P.Tl;
        const std::int64_t gj = P.cc.global(P.kr, j);
        const std::int64_t ko = P.k_at(b * P.Tl + j, grp * P.rep), vo = P.v_at(b * P.Tl + j, grp * P.rep);
        float k[kFlashMaxHeadDim], v[kFlashMaxHeadDim], dk[kFlashMaxHeadDim], dv[kFlashMaxHeadDim];
        for (std::int64_t c = 0; c < P.hs; ++c) {
          k[c] = F::load(kv(ko + c));
          v[c] = F::load(kv(vo + c));
          dk[c] = 0.f;
          dv[c] = 0.f;
        }
        for (std::int64_t h = grp * P.rep; h < (grp + 1) * P.rep; ++h)
          for (std::int64_t half = 0; half < 2; ++half) {
            std::int64_t i0, i1;
            P.query_range(half, gj, &i0, &i1);
            for (std::int64_t i = i0; i < i1; ++i) {
              if (P.first_key(b, i) > gj) continue;  // a query of a later document
              const std::int64_t row = (b * P.nh + h) * P.Tl + i;
              const float L = lse(row);
              if (!(L > kNoKey)) continue;
              const std::int64_t qo = P.q_at(b * P.Tl + i, h), yo = (b * P.Tl + i) * P.C + h * P.hs;
              float sc = 0.f, dp = 0.f;
              for (std::int64_t c = 0; c < P.hs; ++c) {
                sc += F::load(qkv(qo + c)) * P.scale * k[c];
                dp += dy(yo + c) * v[c];
              }
              const float p = fast_exp(sc - L);
              float z = 1.f;
              if (P.dropping)
                z = dropout_uniform(P.key, P.drop_index(b, h, P.cc.global(P.qr, i), gj)) >= P.pdrop ? P.keep_scale
                                                                                                    : 0.f;
              const float ds = p * (z * dp - delta(row)) * P.scale;
              for (std::int64_t c = 0; c < P.hs; ++c) {
                dv[c] += z * p * dy(yo + c);
                dk[c] += ds * F::load(qkv(qo + c));
              }
            }
          }
        const std::int64_t out = (b * P.Tl + j) * 2 * Ckv + grp * P.hs;
        for (std::int64_t c = 0; c < P.hs; ++c) {
          dkv(out + c) += dk[c];
          dkv(out + Ckv + c) += dv[c];
        }
      });
}

// delta_i = dy_i . y_i per query row (= sum_j P_ij dP_ij, dropout included)
template <class F, class V>
void row_deltas(const FloatView& delta, const FloatView& dy, const V& y, const AttentionShape& s) {
  const std::int64_t nh = s.nh, T = s.T, C = s.C, hs = s.hs();
  for_each_index(
      "ops::ring_attention_delta", s.B * nh * T, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (nh * T), h = (r / T) % nh, i = r % T;
        const std::int64_t yo = (b * T + i) * C + h * hs;
        float d = 0.f;
        for (std::int64_t c = 0; c < hs; ++c) d += dy(yo + c) * F::load(y(yo + c));
        delta(r) = d;
      });
}

template <class F>
void store_rows(const HalfView& h, const FloatView& acc, std::int64_t n) {
  for_each_index(
      "ops::ring_forward_end", n, KOKKOS_LAMBDA(std::int64_t e) { h(e) = F::store(acc(e)); });
}

void check_block(const AttentionShape& s, const CpChunks& cc, const Act& qkv, const KvBlock& kv) {
  if (s.hs() > kFlashMaxHeadDim) {
    std::ostringstream os;
    os << "ring attention supports head sizes up to " << kFlashMaxHeadDim << " (model.kv_channels = " << s.hs() << ")";
    throw Error::all(os.str());
  }
  TRIDENT_REQUIRE(cc.Tl == s.T && s.T % 2 == 0 && cc.cp >= 1,
                  "internal: ring attention over " << s.T << " local rows, chunks of " << cc.Tl << " at cp " << cc.cp);
  TRIDENT_REQUIRE(qkv.dt == kv.kv.dt, "internal: ring attention's key/value block has another type than qkv");
}

}  // namespace

void ring_pack_kv(const Act& packed, const Act& qkv, const AttentionShape& s) {
  if (qkv.is_half())
    pack_kv<Bf16Fmt>(packed.h, qkv.h, s);
  else
    pack_kv<F32Fmt>(packed.f, qkv.f, s);
}

void ring_forward_begin(const FloatView& acc, const FloatView& lse, const AttentionShape& s) {
  device_copy(slice(acc, 0, s.B * s.T * s.C), 0.f);
  device_copy(slice(lse, 0, s.B * s.nh * s.T), kNoKey);
}

void ring_forward_block(const FloatView& acc, const FloatView& lse, const Act& qkv, const KvBlock& kv,
                        std::int64_t q_rank, const CpChunks& cc, const AttentionShape& s, const DropoutSpec& drop,
                        const AttentionMask& mask) {
  check_block(s, cc, qkv, kv);
  const RingParams P(s, kv, q_rank, cc, drop, mask);
  switch (qkv.dt) {
    case DType::F32: forward_block<F32Fmt>(acc, lse, qkv.f, kv.kv.f, P, s.B); break;
    case DType::BF16: forward_block<Bf16Fmt>(acc, lse, qkv.h, kv.kv.h, P, s.B); break;
    case DType::F16: forward_block<Fp16Fmt>(acc, lse, qkv.h, kv.kv.h, P, s.B); break;
  }
}

void ring_forward_end(const Act& y, const FloatView& acc, const AttentionShape& s) {
  const std::int64_t n = s.B * s.T * s.C;
  switch (y.dt) {
    case DType::F32: device_copy(slice(y.f, 0, n), slice(acc, 0, n)); break;
    case DType::BF16: store_rows<Bf16Fmt>(y.h, acc, n); break;
    case DType::F16: store_rows<Fp16Fmt>(y.h, acc, n); break;
  }
}

void ring_backward_begin(const FloatView& dqkv, const FloatView& delta, const FloatView& dy, const Act& y,
                         const AttentionShape& s) {
  switch (y.dt) {
    case DType::F32: row_deltas<F32Fmt>(delta, dy, y.f, s); break;
    case DType::BF16: row_deltas<Bf16Fmt>(delta, dy, y.h, s); break;
    case DType::F16: row_deltas<Fp16Fmt>(delta, dy, y.h, s); break;
  }
  const std::int64_t C = s.C, ld = s.C + 2 * s.kv_C();
  for_each_element(
      "ops::ring_attention_zero_dq", s.B * s.T, C,
      KOKKOS_LAMBDA(std::int64_t e, std::int64_t c) { dqkv((e / C) * ld + c) = 0.f; });
}

void ring_backward_block(const FloatView& dqkv, const FloatView& dkv, const FloatView& dy, const Act& qkv,
                         const KvBlock& kv, const FloatView& lse, const FloatView& delta, std::int64_t q_rank,
                         const CpChunks& cc, const AttentionShape& s, const DropoutSpec& drop,
                         const AttentionMask& mask) {
  check_block(s, cc, qkv, kv);
  const RingParams P(s, kv, q_rank, cc, drop, mask);
  switch (qkv.dt) {
    case DType::F32: backward_block<F32Fmt>(dqkv, dkv, dy, qkv.f, kv.kv.f, lse, delta, P, s.B); break;
    case DType::BF16: backward_block<Bf16Fmt>(dqkv, dkv, dy, qkv.h, kv.kv.h, lse, delta, P, s.B); break;
    case DType::F16: backward_block<Fp16Fmt>(dqkv, dkv, dy, qkv.h, kv.kv.h, lse, delta, P, s.B); break;
  }
}

void ring_backward_end(const FloatView& dqkv, const FloatView& dkv, const AttentionShape& s) {
  const std::int64_t C = s.C, W = 2 * s.kv_C(), ld = C + W;
  for_each_element(
      "ops::ring_attention_dkv_home", s.B * s.T, W,
      KOKKOS_LAMBDA(std::int64_t e, std::int64_t c) { dqkv((e / W) * ld + C + c) = dkv(e); });
}

namespace {
template <class V>
void split_heads(const V& send, const V& src, std::int64_t rows, std::int64_t ld, const HeadSplit& hs,
                 std::int64_t cp) {
  const std::int64_t W = hs.width();
  const HeadSplit h = hs;
  for_each_index(
      "ops::cp_split_heads", cp * rows * W, KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t k = e / (rows * W), row = (e / W) % rows;
        std::int64_t c = e % W, seg = 0;
        while (c >= h.len[seg]) c -= h.len[seg++];
        send(e) = src(row * ld + h.off[seg] + k * h.len[seg] + c);
      });
}
template <class V>
void merge_heads(const V& dst, const V& recv, std::int64_t rows, std::int64_t ld, const HeadSplit& hs,
                 std::int64_t cp) {
  const std::int64_t W = hs.width();
  const HeadSplit h = hs;
  for_each_index(
      "ops::cp_merge_heads", cp * rows * W, KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t k = e / (rows * W), row = (e / W) % rows;
        std::int64_t c = e % W, seg = 0;
        while (c >= h.len[seg]) c -= h.len[seg++];
        dst(row * ld + h.off[seg] + k * h.len[seg] + c) = recv(e);
      });
}
// element e of the (cp, B Tl, W) blocks and its place in the (B, T, W) sequence
KOKKOS_INLINE_FUNCTION std::int64_t sequence_place(std::int64_t e, std::int64_t B, const CpChunks& cc, std::int64_t W) {
  const std::int64_t k = e / (B * cc.Tl * W), row = (e / W) % (B * cc.Tl), c = e % W;
  const std::int64_t b = row / cc.Tl, t = row % cc.Tl;
  return (b * cc.T() + cc.global(k, t)) * W + c;
}
template <class V>
void gather_sequence(const V& full, const V& recv, std::int64_t B, const CpChunks& cc, std::int64_t W) {
  for_each_index(
      "ops::cp_gather_sequence", B * cc.T() * W,
      KOKKOS_LAMBDA(std::int64_t e) { full(sequence_place(e, B, cc, W)) = recv(e); });
}
template <class V>
void scatter_sequence(const V& send, const V& full, std::int64_t B, const CpChunks& cc, std::int64_t W) {
  for_each_index(
      "ops::cp_scatter_sequence", B * cc.T() * W,
      KOKKOS_LAMBDA(std::int64_t e) { send(e) = full(sequence_place(e, B, cc, W)); });
}
}  // namespace

void cp_split_heads(const Act& send, const Act& src, std::int64_t rows, std::int64_t ld, const HeadSplit& hs,
                    std::int64_t cp) {
  if (src.is_half())
    split_heads(send.h, src.h, rows, ld, hs, cp);
  else
    split_heads(send.f, src.f, rows, ld, hs, cp);
}
void cp_split_heads(const FloatView& send, const FloatView& src, std::int64_t rows, std::int64_t ld,
                    const HeadSplit& hs, std::int64_t cp) {
  split_heads(send, src, rows, ld, hs, cp);
}
void cp_merge_heads(const Act& dst, const Act& recv, std::int64_t rows, std::int64_t ld, const HeadSplit& hs,
                    std::int64_t cp) {
  if (dst.is_half())
    merge_heads(dst.h, recv.h, rows, ld, hs, cp);
  else
    merge_heads(dst.f, recv.f, rows, ld, hs, cp);
}
void cp_merge_heads(const FloatView& dst, const FloatView& recv, std::int64_t rows, std::int64_t ld,
                    const HeadSplit& hs, std::int64_t cp) {
  merge_heads(dst, recv, rows, ld, hs, cp);
}
void cp_gather_sequence(const Act& full, const Act& recv, std::int64_t B, const CpChunks& cc, std::int64_t width) {
  if (full.is_half())
    gather_sequence(full.h, recv.h, B, cc, width);
  else
    gather_sequence(full.f, recv.f, B, cc, width);
}
void cp_gather_sequence(const FloatView& full, const FloatView& recv, std::int64_t B, const CpChunks& cc,
                        std::int64_t width) {
  gather_sequence(full, recv, B, cc, width);
}
void cp_gather_sequence(const IntView& full, const IntView& recv, std::int64_t B, const CpChunks& cc,
                        std::int64_t width) {
  gather_sequence(full, recv, B, cc, width);
}
void cp_scatter_sequence(const Act& send, const Act& full, std::int64_t B, const CpChunks& cc, std::int64_t width) {
  if (full.is_half())
    scatter_sequence(send.h, full.h, B, cc, width);
  else
    scatter_sequence(send.f, full.f, B, cc, width);
}
void cp_scatter_sequence(const FloatView& send, const FloatView& full, std::int64_t B, const CpChunks& cc,
                         std::int64_t width) {
  scatter_sequence(send, full, B, cc, width);
}

}  // namespace trident
