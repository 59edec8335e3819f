// FlashAttention-style fused attention kernels (one thread per query row forward and for dq,
// one thread per key row for dk and dv; every head-size vector in registers).
#include "ops/flash_attention.hpp"

#include <sstream>
#include <type_traits>

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"

namespace trident {
namespace detail {

constexpr float kNoScore = -3.0e38f;

// What every fused-attention kernel needs, copied into each kernel.
struct FlashParams {
  FlashParams(const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask)
      : T(s.T), C(s.C), nh(s.nh), hs(s.hs()), rep(s.rep()), ld(s.C + 2 * s.kv_C()), voff(s.C + s.kv_C()),
        scale(1.f / dsqrt(static_cast<float>(s.hs()))), causal(mask.causal), has_mask(mask.key_valid.extent(0) > 0),
        dropping(drop.active()), docs(mask.doc_start.extent(0) > 0), valid(mask.key_valid), doc(mask.doc_start),
        pdrop(drop.p), keep_scale(drop.active() ? 1.f / (1.f - drop.p) : 1.f), key(drop.key),
        head_extra(drop.heads > 0 ? (drop.heads - s.nh) * s.T : 0), head_off(drop.head0 * s.T) {}
  std::int64_t T, C, nh, hs;  // sequence, channels of this rank's heads, heads, head size
  // query heads per key/value group; a qkv row's length; where its values start (its keys at C)
  std::int64_t rep, ld, voff;
  // where query head h of token row `row` starts in qkv, and its key and value group's
  KOKKOS_INLINE_FUNCTION std::int64_t q_at(std::int64_t row, std::int64_t h) const { return row * ld + h * hs; }
  KOKKOS_INLINE_FUNCTION std::int64_t k_at(std::int64_t row, std::int64_t h) const {
    return row * ld + C + (h / rep) * hs;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t v_at(std::int64_t row, std::int64_t h) const {
    return row * ld + voff + (h / rep) * hs;
  }
  float scale;  // 1 / sqrt(hs)
  bool causal, has_mask, dropping, docs;
  IntView valid;  // key padding mask (B * T), when has_mask
  IntView doc;    // packed documents (B * T): a query's first key, when docs
  // the first key query row i of sample b attends to (its document's start, else 0)
  KOKKOS_INLINE_FUNCTION std::int64_t first_key(std::int64_t b, std::int64_t i) const {
    return docs ? static_cast<std::int64_t>(doc(b * T + i)) : 0;
  }
  float pdrop, keep_scale;  // dropout probability, 1 / (1 - p)
  std::uint64_t key;        // dropout stream
  // Context parallelism over heads (DropoutSpec::head0 / heads): this call's heads are heads
  // [head0, head0 + nh) of `heads`, and the mask of element (b, h, i, j) is that of element
  // (b, head0 + h, i, j) of all of them; else the element's own index.
  std::int64_t head_extra = 0, head_off = 0;  // (heads - nh) T and head0 T
  // the dropout counter of element j of probability row r = (b nh + h) T + i
  KOKKOS_INLINE_FUNCTION std::uint64_t drop_at(std::int64_t r, std::int64_t j) const {
    if (head_extra == 0 && head_off == 0) return static_cast<std::uint64_t>(r * T + j);
    return static_cast<std::uint64_t>((r + (r / (nh * T)) * head_extra + head_off) * T + j);
  }
};

// ---- the device layout (common/device_parallel.hpp) ------------------------------------------------
// The host kernels keep q, o, dq, k, v, dk, dv of a row in arrays of kFlashMaxHeadDim floats indexed
// by the run-time head size, which a GPU cannot keep in registers: the arrays go to local memory
// (measured on an H200 at GPT-2 124M, micro-batch 8: forward 6.8 ms, dq 12 ms, dk+dv 85 ms per
// layer). On a device the head size is a template argument where it is one of kDeviceHeadDims
// (the loops unroll and the arrays are registers; HS 0: the run-time size), and the key/value pass
// is two kernels, dv (k, dv) and dk (k, v, dk), so that no thread holds four rows. Each thread
// adds the same terms in the same order as the host's kernel.
template <int HS>
KOKKOS_INLINE_FUNCTION std::int64_t head_dim(const FlashParams& P) {
  if constexpr (HS > 0)
    return HS;
  else
    return P.hs;
}
// Causal key/value passes: a thread's queries start at its own key row; the loop starts at the
// first row of its block of kWarpRows key rows (a GPU warp's) and skips the queries before its own,
// so that at each step the warp's threads read the same query row (one broadcast, not a row per
// thread: 35 ms per layer for each of dk and dv at GPT-2 124M, micro-batch 8). The same terms are
// added in the same order.
constexpr std::int64_t kWarpRows = 32;
template <int HS>
inline constexpr int kRowCapacity = HS > 0 ? HS : static_cast<int>(kFlashMaxHeadDim);

template <class F, int HS, class V>
void device_forward(const FlashParams& P, const V& y, const FloatView& lse, const V& qkv, std::int64_t B) {
  Kokkos::parallel_for(
      "ops::flash_attention_forward", range(B * P.nh * P.T), KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t hs = head_dim<HS>(P);
        const std::int64_t b = r / (P.nh * P.T), h = (r / P.T) % P.nh, i = r % P.T;
        float q[kRowCapacity<HS>], o[kRowCapacity<HS>];
        const std::int64_t qo = P.q_at(b * P.T + i, h);
        for (std::int64_t c = 0; c < hs; ++c) {
          q[c] = F::load(qkv(qo + c)) * P.scale;
          o[c] = 0.f;
        }
        float m = kNoScore, l = 0.f;
        const std::int64_t jend = P.causal ? i + 1 : P.T;
        for (std::int64_t j = P.first_key(b, i); j < jend; ++j) {
          if (P.has_mask && P.valid(b * P.T + j) == 0) continue;
          const std::int64_t ko = P.k_at(b * P.T + j, h), vo = P.v_at(b * P.T + j, h);
          float sc = 0.f;
          for (std::int64_t c = 0; c < hs; ++c) sc += q[c] * F::load(qkv(ko + c));
          if (sc > m) {
            const float corr = fast_exp(m - sc);
            l *= corr;
            for (std::int64_t c = 0; c < hs; ++c) o[c] *= corr;
            m = sc;
          }
          const float p = fast_exp(sc - m);
          l += p;
          float pd = p;
          if (P.dropping) pd = dropout_uniform(P.key, P.drop_at(r, j)) >= P.pdrop ? p * P.keep_scale : 0.f;
          if (pd != 0.f)
            for (std::int64_t c = 0; c < hs; ++c) o[c] += pd * F::load(qkv(vo + c));
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const std::int64_t yo = (b * P.T + i) * P.C + h * hs;
        for (std::int64_t c = 0; c < hs; ++c) y(yo + c) = F::store(o[c] * inv);
        lse(r) = l > 0.f ? m + dlog(l) : kNoScore;
      });
}

template <class F, int HS, class V>
void device_backward(const FlashParams& P, const FloatView& dqkv, const FloatView& dy, const V& qkv,
                     const FloatView& lse, const FloatView& delta, std::int64_t B) {
  Kokkos::parallel_for(
      "ops::flash_attention_backward_dq", range(B * P.nh * P.T), KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t hs = head_dim<HS>(P);
        const std::int64_t b = r / (P.nh * P.T), h = (r / P.T) % P.nh, i = r % P.T;
        const std::int64_t qo = P.q_at(b * P.T + i, h), yo = (b * P.T + i) * P.C + h * hs;
        float q[kRowCapacity<HS>], g[kRowCapacity<HS>], dq[kRowCapacity<HS>];
        for (std::int64_t c = 0; c < hs; ++c) {
          q[c] = F::load(qkv(qo + c)) * P.scale;
          g[c] = dy(yo + c);
          dq[c] = 0.f;
        }
        const float L = lse(r), D = delta(r);
        const std::int64_t jend = L > kNoScore ? (P.causal ? i + 1 : P.T) : 0;
        for (std::int64_t j = P.first_key(b, i); j < jend; ++j) {
          if (P.has_mask && P.valid(b * P.T + j) == 0) continue;
          const std::int64_t ko = P.k_at(b * P.T + j, h), vo = P.v_at(b * P.T + j, h);
          float sc = 0.f, dp = 0.f;
          for (std::int64_t c = 0; c < hs; ++c) {
            sc += q[c] * F::load(qkv(ko + c));
            dp += g[c] * F::load(qkv(vo + c));
          }
          const float p = fast_exp(sc - L);
          if (P.dropping) dp = dropout_uniform(P.key, P.drop_at(r, j)) >= P.pdrop ? dp * P.keep_scale : 0.f;
          const float ds = p * (dp - D) * P.scale;
          for (std::int64_t c = 0; c < hs; ++c) dq[c] += ds * F::load(qkv(ko + c));
        }
        for (std::int64_t c = 0; c < hs; ++c) dqkv(qo + c) = dq[c];
      });
  const std::int64_t key_rows = B * (P.nh / P.rep) * P.T;
  Kokkos::parallel_for(
      "ops::flash_attention_backward_dv", range(key_rows), KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t hs = head_dim<HS>(P);
        const std::int64_t ngr = P.nh / P.rep, b = r / (ngr * P.T), grp = (r / P.T) % ngr, j = r % P.T;
        const std::int64_t ko = P.k_at(b * P.T + j, grp * P.rep), vo = P.v_at(b * P.T + j, grp * P.rep);
        float k[kRowCapacity<HS>], dv[kRowCapacity<HS>];
        for (std::int64_t c = 0; c < hs; ++c) {
          k[c] = F::load(qkv(ko + c));
          dv[c] = 0.f;
        }
        const bool attended = !P.has_mask || P.valid(b * P.T + j) != 0;
        const std::int64_t ibeg = attended ? (P.causal ? j : 0) : P.T;
        const std::int64_t i0 = attended && P.causal ? j / kWarpRows * kWarpRows : ibeg;
        for (std::int64_t h = grp * P.rep; h < (grp + 1) * P.rep; ++h)
          for (std::int64_t i = i0; i < P.T; ++i) {
            if (i < ibeg) continue;
            if (P.first_key(b, i) > j) continue;  // a query of a later document
            const std::int64_t row = (b * P.nh + h) * P.T + i;
            const float L = lse(row);
            if (!(L > kNoScore)) continue;
            const std::int64_t qo = P.q_at(b * P.T + i, h), yo = (b * P.T + i) * P.C + h * hs;
            float sc = 0.f;
            for (std::int64_t c = 0; c < hs; ++c) sc += F::load(qkv(qo + c)) * P.scale * k[c];
            const float p = fast_exp(sc - L);
            float z = 1.f;
            if (P.dropping) z = dropout_uniform(P.key, P.drop_at(row, j)) >= P.pdrop ? P.keep_scale : 0.f;
            for (std::int64_t c = 0; c < hs; ++c) dv[c] += z * p * dy(yo + c);
          }
        for (std::int64_t c = 0; c < hs; ++c) dqkv(vo + c) = dv[c];
      });
  Kokkos::parallel_for(
      "ops::flash_attention_backward_dk", range(key_rows), KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t hs = head_dim<HS>(P);
        const std::int64_t ngr = P.nh / P.rep, b = r / (ngr * P.T), grp = (r / P.T) % ngr, j = r % P.T;
        const std::int64_t ko = P.k_at(b * P.T + j, grp * P.rep), vo = P.v_at(b * P.T + j, grp * P.rep);
        float k[kRowCapacity<HS>], v[kRowCapacity<HS>], dk[kRowCapacity<HS>];
        for (std::int64_t c = 0; c < hs; ++c) {
          k[c] = F::load(qkv(ko + c));
          v[c] = F::load(qkv(vo + c));
          dk[c] = 0.f;
        }
        const bool attended = !P.has_mask || P.valid(b * P.T + j) != 0;
        const std::int64_t ibeg = attended ? (P.causal ? j : 0) : P.T;
        const std::int64_t i0 = attended && P.causal ? j / kWarpRows * kWarpRows : ibeg;
        for (std::int64_t h = grp * P.rep; h < (grp + 1) * P.rep; ++h)
          for (std::int64_t i = i0; i < P.T; ++i) {
            if (i < ibeg) continue;
            if (P.first_key(b, i) > j) continue;  // a query of a later document
            const std::int64_t row = (b * P.nh + h) * P.T + i;
            const float L = lse(row);
            if (!(L > kNoScore)) continue;
            const std::int64_t qo = P.q_at(b * P.T + i, h), yo = (b * P.T + i) * P.C + h * hs;
            float sc = 0.f, dp = 0.f;
            for (std::int64_t c = 0; c < hs; ++c) {
              sc += F::load(qkv(qo + c)) * P.scale * k[c];
              dp += dy(yo + c) * v[c];
            }
            const float p = fast_exp(sc - L);
            float z = 1.f;
            if (P.dropping) z = dropout_uniform(P.key, P.drop_at(row, j)) >= P.pdrop ? P.keep_scale : 0.f;
            const float ds = p * (z * dp - delta(row)) * P.scale;
            for (std::int64_t c = 0; c < hs; ++c) dk[c] += ds * F::load(qkv(qo + c));
          }
        for (std::int64_t c = 0; c < hs; ++c) dqkv(ko + c) = dk[c];
      });
}

// f(std::integral_constant<int, HS>) with HS the head size where it is one the device kernels are
// compiled for, else 0 (the run-time size).
template <class Fn>
void with_head_dim(std::int64_t hs, const Fn& f) {
  switch (hs) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 0>{}); break;
  }
}

template <class F, class V>
void flash_forward(const V& y, const FloatView& lse, const V& qkv, AttentionShape s, DropoutSpec drop,
                   AttentionMask mask) {
  const FlashParams P(s, drop, mask);
  if constexpr (kDeviceKernels) {
    with_head_dim(P.hs, [&](auto hs) { device_forward<F, decltype(hs)::value>(P, y, lse, qkv, s.B); });
    return;
  }
  for_each_index(
      "ops::flash_attention_forward", s.B * P.nh * P.T, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (P.nh * P.T), h = (r / P.T) % P.nh, i = r % P.T;
        float q[kFlashMaxHeadDim], o[kFlashMaxHeadDim];
        const std::int64_t qo = P.q_at(b * P.T + i, h);
        for (std::int64_t c = 0; c < P.hs; ++c) {
          q[c] = F::load(qkv(qo + c)) * P.scale;
          o[c] = 0.f;
        }
        float m = kNoScore, l = 0.f;
        const std::int64_t jend = P.causal ? i + 1 : P.T;
        for (std::int64_t j = P.first_key(b, i); j < jend; ++j) {
          if (P.has_mask && P.valid(b * P.T + j) == 0) continue;
          const std::int64_t ko = P.k_at(b * P.T + j, h), vo = P.v_at(b * P.T + j, h);
          float sc = 0.f;
          for (std::int64_t c = 0; c < P.hs; ++c) sc += q[c] * F::load(qkv(ko + c));
          if (sc > m) {  // online softmax: rescale what was accumulated under the old maximum
            const float corr = fast_exp(m - sc);
            l *= corr;
            for (std::int64_t c = 0; c < P.hs; ++c) o[c] *= corr;
            m = sc;
          }
          const float p = fast_exp(sc - m);
          l += p;
          float pd = p;
          if (P.dropping) pd = dropout_uniform(P.key, P.drop_at(r, j)) >= P.pdrop ? p * P.keep_scale : 0.f;
          if (pd != 0.f)
            for (std::int64_t c = 0; c < P.hs; ++c) o[c] += pd * F::load(qkv(vo + c));
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const std::int64_t yo = (b * P.T + i) * P.C + h * P.hs;
        for (std::int64_t c = 0; c < P.hs; ++c) y(yo + c) = F::store(o[c] * inv);
        lse(r) = l > 0.f ? m + dlog(l) : kNoScore;
      });
}

template <class F, class V>
void flash_backward(const FloatView& dqkv, const FloatView& dy, const V& qkv, const V& y, const FloatView& lse,
                    const FloatView& delta, AttentionShape s, DropoutSpec drop, AttentionMask mask) {
  const FlashParams P(s, drop, mask);
  // delta_i = dy_i . y_i  (= sum_j P_ij dP_ij, dropout included)
  for_each_index(
      "ops::flash_attention_delta", s.B * P.nh * P.T, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (P.nh * P.T), h = (r / P.T) % P.nh, i = r % P.T;
        const std::int64_t yo = (b * P.T + i) * P.C + h * P.hs;
        float d = 0.f;
        for (std::int64_t c = 0; c < P.hs; ++c) d += dy(yo + c) * F::load(y(yo + c));
        delta(r) = d;
      });
  if constexpr (kDeviceKernels) {
    with_head_dim(P.hs, [&](auto hs) { device_backward<F, decltype(hs)::value>(P, dqkv, dy, qkv, lse, delta, s.B); });
    return;
  }
  // pass 1, one thread per query row: dq_i = P.scale sum_j dS_ij k_j
  for_each_index(
      "ops::flash_attention_backward_dq", s.B * P.nh * P.T, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t b = r / (P.nh * P.T), h = (r / P.T) % P.nh, i = r % P.T;
        const std::int64_t qo = P.q_at(b * P.T + i, h), yo = (b * P.T + i) * P.C + h * P.hs;
        float q[kFlashMaxHeadDim], g[kFlashMaxHeadDim], dq[kFlashMaxHeadDim];
        for (std::int64_t c = 0; c < P.hs; ++c) {
          q[c] = F::load(qkv(qo + c)) * P.scale;
          g[c] = dy(yo + c);
          dq[c] = 0.f;
        }
        const float L = lse(r), D = delta(r);
        const std::int64_t jend = L > kNoScore ? (P.causal ? i + 1 : P.T) : 0;
        for (std::int64_t j = P.first_key(b, i); j < jend; ++j) {
          if (P.has_mask && P.valid(b * P.T + j) == 0) continue;
          const std::int64_t ko = P.k_at(b * P.T + j, h), vo = P.v_at(b * P.T + j, h);
          float sc = 0.f, dp = 0.f;
          for (std::int64_t c = 0; c < P.hs; ++c) {
            sc += q[c] * F::load(qkv(ko + c));
            dp += g[c] * F::load(qkv(vo + c));
          }
          const float p = fast_exp(sc - L);
          if (P.dropping) dp = dropout_uniform(P.key, P.drop_at(r, j)) >= P.pdrop ? dp * P.keep_scale : 0.f;
          const float ds = p * (dp - D) * P.scale;
          for (std::int64_t c = 0; c < P.hs; ++c) dq[c] += ds * F::load(qkv(ko + c));
        }
        for (std::int64_t c = 0; c < P.hs; ++c) dqkv(qo + c) = dq[c];
      });
  // pass 2, one thread per key row of each key/value group: dv_j = sum_i Z_ij P_ij dy_i and
  // dk_j = P.scale sum_i dS_ij q_i, summed over the group's query heads
  for_each_index(
      "ops::flash_attention_backward_dkv", s.B * (P.nh / P.rep) * P.T, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t ngr = P.nh / P.rep, b = r / (ngr * P.T), grp = (r / P.T) % ngr, j = r % P.T;
        const std::int64_t ko = P.k_at(b * P.T + j, grp * P.rep), vo = P.v_at(b * P.T + j, grp * P.rep);
        float k[kFlashMaxHeadDim], v[kFlashMaxHeadDim], dk[kFlashMaxHeadDim], dv[kFlashMaxHeadDim];
        for (std::int64_t c = 0; c < P.hs; ++c) {
          k[c] = F::load(qkv(ko + c));
          v[c] = F::load(qkv(vo + c));
          dk[c] = 0.f;
          dv[c] = 0.f;
        }
        const bool attended = !P.has_mask || P.valid(b * P.T + j) != 0;
        const std::int64_t ibeg = attended ? (P.causal ? j : 0) : P.T;
        for (std::int64_t h = grp * P.rep; h < (grp + 1) * P.rep; ++h)
          for (std::int64_t i = ibeg; i < P.T; ++i) {
            if (P.first_key(b, i) > j) continue;  // a query of a later document
            const std::int64_t row = (b * P.nh + h) * P.T + i;
            const float L = lse(row);
            if (!(L > kNoScore)) continue;
            const std::int64_t qo = P.q_at(b * P.T + i, h), yo = (b * P.T + i) * P.C + h * P.hs;
            float sc = 0.f, dp = 0.f;
            for (std::int64_t c = 0; c < P.hs; ++c) {
              sc += F::load(qkv(qo + c)) * P.scale * k[c];
              dp += dy(yo + c) * v[c];
            }
            const float p = fast_exp(sc - L);
            float z = 1.f;
            if (P.dropping) z = dropout_uniform(P.key, P.drop_at(row, j)) >= P.pdrop ? P.keep_scale : 0.f;
            const float ds = p * (z * dp - delta(row)) * P.scale;
            for (std::int64_t c = 0; c < P.hs; ++c) {
              dv[c] += z * p * dy(yo + c);
              dk[c] += ds * F::load(qkv(qo + c));
            }
          }
        for (std::int64_t c = 0; c < P.hs; ++c) {
          dqkv(ko + c) = dk[c];
          dqkv(vo + c) = dv[c];
        }
      });
}

}  // namespace detail

namespace {
void check_head_dim(const AttentionShape& s) {
  if (s.hs() > kFlashMaxHeadDim) {
    std::ostringstream os;
    os << "flash attention supports head sizes up to " << kFlashMaxHeadDim << " (model.kv_channels = " << s.hs() << ")";
    throw Error::all(os.str());
  }
}
}  // namespace

void flash_attention_forward(const Act& y, const FloatView& lse, const Act& qkv, const AttentionShape& s,
                             const DropoutSpec& drop, const AttentionMask& mask) {
  check_head_dim(s);
  switch (qkv.dt) {
    case DType::F32: detail::flash_forward<F32Fmt>(y.f, lse, qkv.f, s, drop, mask); break;
    case DType::BF16: detail::flash_forward<Bf16Fmt>(y.h, lse, qkv.h, s, drop, mask); break;
    case DType::F16: detail::flash_forward<Fp16Fmt>(y.h, lse, qkv.h, s, drop, mask); break;
  }
}

void flash_attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& y,
                              const FloatView& lse, const FloatView& delta, const AttentionShape& s,
                              const DropoutSpec& drop, const AttentionMask& mask) {
  check_head_dim(s);
  switch (qkv.dt) {
    case DType::F32: detail::flash_backward<F32Fmt>(dqkv, dy, qkv.f, y.f, lse, delta, s, drop, mask); break;
    case DType::BF16: detail::flash_backward<Bf16Fmt>(dqkv, dy, qkv.h, y.h, lse, delta, s, drop, mask); break;
    case DType::F16: detail::flash_backward<Fp16Fmt>(dqkv, dy, qkv.h, y.h, lse, delta, s, drop, mask); break;
  }
}

}  // namespace trident
