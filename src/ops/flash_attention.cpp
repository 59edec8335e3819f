// FlashAttention-style fused attention kernels (one thread per query row forward and for dq,
// one thread per key row for dk and dv; every head-size vector in registers).
#include "ops/flash_attention.hpp"

#include <sstream>

#include "common/device_math.hpp"
#include "common/error.hpp"

namespace trident {
namespace detail {

constexpr float kNoScore = -3.0e38f;

template <class F, class V>
void flash_forward(const V& y, const FloatView& lse, const V& qkv, AttentionShape s, DropoutSpec drop,
                   AttentionMask mask) {
  const std::int64_t T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  const float scale = 1.f / dsqrt(static_cast<float>(hs));
  const bool causal = mask.causal, has_mask = mask.key_valid.extent(0) > 0, dropping = drop.active();
  const IntView valid = mask.key_valid;
  const float pdrop = drop.p, keep_scale = dropping ? 1.f / (1.f - drop.p) : 1.f;
  const std::uint64_t key = drop.key;
  Kokkos::parallel_for("ops::flash_attention_forward", range(s.B * nh * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t b = r / (nh * T), h = (r / T) % nh, i = r % T;
    float q[kFlashMaxHeadDim], o[kFlashMaxHeadDim];
    const std::int64_t qo = (b * T + i) * 3 * C + h * hs;
    for (std::int64_t c = 0; c < hs; ++c) {
      q[c] = F::load(qkv(qo + c)) * scale;
      o[c] = 0.f;
    }
    float m = kNoScore, l = 0.f;
    const std::int64_t jend = causal ? i + 1 : T;
    for (std::int64_t j = 0; j < jend; ++j) {
      if (has_mask && valid(b * T + j) == 0) continue;
      const std::int64_t ko = (b * T + j) * 3 * C + C + h * hs, vo = ko + C;
      float sc = 0.f;
      for (std::int64_t c = 0; c < hs; ++c) sc += q[c] * F::load(qkv(ko + c));
      if (sc > m) {  // online softmax: rescale what was accumulated under the old maximum
        const float corr = fast_exp(m - sc);
        l *= corr;
        for (std::int64_t c = 0; c < hs; ++c) o[c] *= corr;
        m = sc;
      }
      const float p = fast_exp(sc - m);
      l += p;
      float pd = p;
      if (dropping)
        pd = dropout_uniform(key, static_cast<std::uint64_t>(r * T + j)) >= pdrop ? p * keep_scale : 0.f;
      if (pd != 0.f)
        for (std::int64_t c = 0; c < hs; ++c) o[c] += pd * F::load(qkv(vo + c));
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const std::int64_t yo = (b * T + i) * C + h * hs;
    for (std::int64_t c = 0; c < hs; ++c) y(yo + c) = F::store(o[c] * inv);
    lse(r) = l > 0.f ? m + dlog(l) : kNoScore;
  });
}

template <class F, class V>
void flash_backward(const FloatView& dqkv, const FloatView& dy, const V& qkv, const V& y, const FloatView& lse,
                    const FloatView& delta, AttentionShape s, DropoutSpec drop, AttentionMask mask) {
  const std::int64_t T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  const float scale = 1.f / dsqrt(static_cast<float>(hs));
  const bool causal = mask.causal, has_mask = mask.key_valid.extent(0) > 0, dropping = drop.active();
  const IntView valid = mask.key_valid;
  const float pdrop = drop.p, keep_scale = dropping ? 1.f / (1.f - drop.p) : 1.f;
  const std::uint64_t key = drop.key;
  // delta_i = dy_i . y_i  (= sum_j P_ij dP_ij, dropout included)
  Kokkos::parallel_for("ops::flash_attention_delta", range(s.B * nh * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t b = r / (nh * T), h = (r / T) % nh, i = r % T;
    const std::int64_t yo = (b * T + i) * C + h * hs;
    float d = 0.f;
    for (std::int64_t c = 0; c < hs; ++c) d += dy(yo + c) * F::load(y(yo + c));
    delta(r) = d;
  });
  // pass 1, one thread per query row: dq_i = scale sum_j dS_ij k_j
  Kokkos::parallel_for("ops::flash_attention_backward_dq", range(s.B * nh * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t b = r / (nh * T), h = (r / T) % nh, i = r % T;
    const std::int64_t qo = (b * T + i) * 3 * C + h * hs, yo = (b * T + i) * C + h * hs;
    float q[kFlashMaxHeadDim], g[kFlashMaxHeadDim], dq[kFlashMaxHeadDim];
    for (std::int64_t c = 0; c < hs; ++c) {
      q[c] = F::load(qkv(qo + c)) * scale;
      g[c] = dy(yo + c);
      dq[c] = 0.f;
    }
    const float L = lse(r), D = delta(r);
    const std::int64_t jend = L > kNoScore ? (causal ? i + 1 : T) : 0;
    for (std::int64_t j = 0; j < jend; ++j) {
      if (has_mask && valid(b * T + j) == 0) continue;
      const std::int64_t ko = (b * T + j) * 3 * C + C + h * hs, vo = ko + C;
      float sc = 0.f, dp = 0.f;
      for (std::int64_t c = 0; c < hs; ++c) {
        sc += q[c] * F::load(qkv(ko + c));
        dp += g[c] * F::load(qkv(vo + c));
      }
      const float p = fast_exp(sc - L);
      if (dropping) dp = dropout_uniform(key, static_cast<std::uint64_t>(r * T + j)) >= pdrop ? dp * keep_scale : 0.f;
      const float ds = p * (dp - D) * scale;
      for (std::int64_t c = 0; c < hs; ++c) dq[c] += ds * F::load(qkv(ko + c));
    }
    for (std::int64_t c = 0; c < hs; ++c) dqkv(qo + c) = dq[c];
  });
  // pass 2, one thread per key row: dv_j = sum_i Z_ij P_ij dy_i ; dk_j = scale sum_i dS_ij q_i
  Kokkos::parallel_for("ops::flash_attention_backward_dkv", range(s.B * nh * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t b = r / (nh * T), h = (r / T) % nh, j = r % T;
    const std::int64_t ko = (b * T + j) * 3 * C + C + h * hs, vo = ko + C;
    float k[kFlashMaxHeadDim], v[kFlashMaxHeadDim], dk[kFlashMaxHeadDim], dv[kFlashMaxHeadDim];
    for (std::int64_t c = 0; c < hs; ++c) {
      k[c] = F::load(qkv(ko + c));
      v[c] = F::load(qkv(vo + c));
      dk[c] = 0.f;
      dv[c] = 0.f;
    }
    const bool attended = !has_mask || valid(b * T + j) != 0;
    const std::int64_t ibeg = attended ? (causal ? j : 0) : T;
    for (std::int64_t i = ibeg; i < T; ++i) {
      const std::int64_t row = (b * nh + h) * T + i;
      const float L = lse(row);
      if (!(L > kNoScore)) continue;
      const std::int64_t qo = (b * T + i) * 3 * C + h * hs, yo = (b * T + i) * C + h * hs;
      float sc = 0.f, dp = 0.f;
      for (std::int64_t c = 0; c < hs; ++c) {
        sc += F::load(qkv(qo + c)) * scale * k[c];
        dp += dy(yo + c) * v[c];
      }
      const float p = fast_exp(sc - L);
      float z = 1.f;
      if (dropping) z = dropout_uniform(key, static_cast<std::uint64_t>(row * T + j)) >= pdrop ? keep_scale : 0.f;
      const float ds = p * (z * dp - delta(row)) * scale;
      for (std::int64_t c = 0; c < hs; ++c) {
        dv[c] += z * p * dy(yo + c);
        dk[c] += ds * F::load(qkv(qo + c));
      }
    }
    for (std::int64_t c = 0; c < hs; ++c) {
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
    os << "flash attention supports head sizes up to " << kFlashMaxHeadDim << " (model.hidden_size / model.num_heads = "
       << s.hs() << ")";
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
