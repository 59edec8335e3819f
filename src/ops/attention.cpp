// Core attention forward/backward.
#include "ops/attention.hpp"

#include "common/device_math.hpp"
#include "ops/gemm.hpp"

namespace trident {

void causal_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t T, float scale) {
  Kokkos::parallel_for("ops::causal_softmax_forward", range(BH * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t i = r % T, base = r * T;
    float mx = -3.0e38f;
    for (std::int64_t j = 0; j <= i; ++j) mx = dmax(mx, att(base + j) * scale);
    float sum = 0.f;
    for (std::int64_t j = 0; j <= i; ++j) {
      const float e = fast_exp(att(base + j) * scale - mx);
      att(base + j) = e;
      sum += e;
    }
    const float inv = 1.f / sum;
    for (std::int64_t j = 0; j <= i; ++j) att(base + j) *= inv;
    for (std::int64_t j = i + 1; j < T; ++j) att(base + j) = 0.f;
  });
}

void causal_softmax_backward(const FloatView& datt, const FloatView& att, std::int64_t BH, std::int64_t T,
                             float scale) {
  Kokkos::parallel_for("ops::causal_softmax_backward", range(BH * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t i = r % T, base = r * T;
    float dot = 0.f;
    for (std::int64_t j = 0; j <= i; ++j) dot += datt(base + j) * att(base + j);
    for (std::int64_t j = 0; j <= i; ++j) datt(base + j) = att(base + j) * (datt(base + j) - dot) * scale;
    for (std::int64_t j = i + 1; j < T; ++j) datt(base + j) = 0.f;
  });
}

namespace {
// (B, T, 3C) -> three (B, nh, T, hs)
void split_heads(const FloatView& q, const FloatView& k, const FloatView& v, const FloatView& qkv,
                 const AttentionShape& s) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  Kokkos::parallel_for("ops::attention_split_heads", range(B * T * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t d = i % hs, h = (i / hs) % nh, t = (i / C) % T, b = i / (T * C);
    const std::int64_t src = (b * T + t) * 3 * C + h * hs + d;
    const std::int64_t dst = ((b * nh + h) * T + t) * hs + d;
    q(dst) = qkv(src);
    k(dst) = qkv(src + C);
    v(dst) = qkv(src + 2 * C);
  });
}
// three (B, nh, T, hs) -> (B, T, 3C)
void merge_heads3(const FloatView& qkv, const FloatView& q, const FloatView& k, const FloatView& v,
                  const AttentionShape& s) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  Kokkos::parallel_for("ops::attention_merge_heads3", range(B * T * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t d = i % hs, h = (i / hs) % nh, t = (i / C) % T, b = i / (T * C);
    const std::int64_t dst = (b * T + t) * 3 * C + h * hs + d;
    const std::int64_t src = ((b * nh + h) * T + t) * hs + d;
    qkv(dst) = q(src);
    qkv(dst + C) = k(src);
    qkv(dst + 2 * C) = v(src);
  });
}
// (B, nh, T, hs) <-> (B, T, C); to_heads selects the direction.
void permute_heads(const FloatView& dst, const FloatView& src, const AttentionShape& s, bool to_heads) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  Kokkos::parallel_for("ops::attention_permute_heads", range(B * T * C), KOKKOS_LAMBDA(std::int64_t i) {
    const std::int64_t d = i % hs, h = (i / hs) % nh, t = (i / C) % T, b = i / (T * C);
    const std::int64_t flat = (b * T + t) * C + h * hs + d;
    const std::int64_t heads = ((b * nh + h) * T + t) * hs + d;
    if (to_heads)
      dst(heads) = src(flat);
    else
      dst(flat) = src(heads);
  });
}
}  // namespace

void attention_forward(const FloatView& y, const FloatView& q, const FloatView& k, const FloatView& v,
                       const FloatView& att, const FloatView& yperm, const FloatView& qkv,
                       const AttentionShape& s, const DropoutSpec& drop, const FloatView& att_drop) {
  const std::int64_t T = s.T, hs = s.hs(), BH = s.B * s.nh;
  split_heads(q, k, v, qkv, s);
  Kokkos::fence();
  // scores (T, T) = q (T, hs) k^T (hs, T), per (b, h); the 1/sqrt(hs) scale is applied in softmax
  gemm_strided_batched(Trans::N, Trans::T, T, T, hs, 1.f, q.data(), hs, T * hs, k.data(), hs, T * hs, 0.f,
                       att.data(), T, T * T, BH);
  causal_softmax_forward(att, BH, T, 1.f / dsqrt(static_cast<float>(hs)));
  const FloatView& probs = drop.active() ? att_drop : att;
  if (drop.active()) dropout_forward(att_drop, att, BH * T * T, drop);
  Kokkos::fence();
  // yperm (T, hs) = att (T, T) v (T, hs)
  gemm_strided_batched(Trans::N, Trans::N, T, hs, T, 1.f, probs.data(), T, T * T, v.data(), hs, T * hs, 0.f,
                       yperm.data(), hs, T * hs, BH);
  permute_heads(y, yperm, s, /*to_heads=*/false);
}

void attention_backward(const FloatView& dqkv, const FloatView& dy, const FloatView& q, const FloatView& k,
                        const FloatView& v, const FloatView& att, const FloatView& dyperm, const FloatView& datt,
                        const FloatView& dq, const FloatView& dk, const FloatView& dv, const AttentionShape& s,
                        const DropoutSpec& drop, const FloatView& att_drop) {
  const std::int64_t T = s.T, hs = s.hs(), BH = s.B * s.nh;
  permute_heads(dyperm, dy, s, /*to_heads=*/true);
  Kokkos::fence();
  // datt (T, T) = dy (T, hs) v^T ; dv (T, hs) = att^T (T, T) dy (T, hs)
  gemm_strided_batched(Trans::N, Trans::T, T, T, hs, 1.f, dyperm.data(), hs, T * hs, v.data(), hs, T * hs, 0.f,
                       datt.data(), T, T * T, BH);
  const FloatView& probs = drop.active() ? att_drop : att;
  gemm_strided_batched(Trans::T, Trans::N, T, hs, T, 1.f, probs.data(), T, T * T, dyperm.data(), hs, T * hs, 0.f,
                       dv.data(), hs, T * hs, BH);
  if (drop.active()) dropout_backward(datt, datt, BH * T * T, drop);
  causal_softmax_backward(datt, att, BH, T, 1.f / dsqrt(static_cast<float>(hs)));
  Kokkos::fence();
  // dq = dscores k ; dk = dscores^T q
  gemm_strided_batched(Trans::N, Trans::N, T, hs, T, 1.f, datt.data(), T, T * T, k.data(), hs, T * hs, 0.f,
                       dq.data(), hs, T * hs, BH);
  gemm_strided_batched(Trans::T, Trans::N, T, hs, T, 1.f, datt.data(), T, T * T, q.data(), hs, T * hs, 0.f,
                       dk.data(), hs, T * hs, BH);
  merge_heads3(dqkv, dq, dk, dv, s);
}

}  // namespace trident
