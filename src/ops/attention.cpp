// Core attention forward/backward.
#include "ops/attention.hpp"

#include "common/device_math.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

void masked_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t T, std::int64_t nh, float scale,
                            const AttentionMask& mask) {
  const bool causal = mask.causal, padded = mask.key_valid.extent(0) > 0;
  const IntView valid = mask.key_valid;
  Kokkos::parallel_for("ops::masked_softmax_forward", range(BH * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t i = r % T, base = r * T, key0 = (r / (nh * T)) * T;  // first key of the sample
    const std::int64_t jend = causal ? i + 1 : T;
    auto on = [&](std::int64_t j) { return !padded || valid(key0 + j) != 0; };
    float mx = -3.0e38f;
    bool any = false;
    for (std::int64_t j = 0; j < jend; ++j)
      if (on(j)) {
        mx = dmax(mx, att(base + j) * scale);
        any = true;
      }
    float sum = 0.f;
    for (std::int64_t j = 0; j < jend; ++j) {
      const float e = on(j) ? fast_exp(att(base + j) * scale - mx) : 0.f;
      att(base + j) = e;
      sum += e;
    }
    const float inv = any ? 1.f / sum : 0.f;
    for (std::int64_t j = 0; j < jend; ++j) att(base + j) *= inv;
    for (std::int64_t j = jend; j < T; ++j) att(base + j) = 0.f;
  });
}

void masked_softmax_backward(const FloatView& datt, const FloatView& att, std::int64_t BH, std::int64_t T,
                             float scale, bool causal) {
  Kokkos::parallel_for("ops::masked_softmax_backward", range(BH * T), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t i = r % T, base = r * T, jend = causal ? i + 1 : T;
    float dot = 0.f;
    for (std::int64_t j = 0; j < jend; ++j) dot += datt(base + j) * att(base + j);
    // masked keys have att = 0, hence a zero gradient
    for (std::int64_t j = 0; j < jend; ++j) datt(base + j) = att(base + j) * (datt(base + j) - dot) * scale;
    for (std::int64_t j = jend; j < T; ++j) datt(base + j) = 0.f;
  });
}

void attention_probs(const FloatView& att, const FloatView& att_drop, const FloatView& qkv, const AttentionShape& s,
                     const DropoutSpec& drop, const AttentionMask& mask) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  // Heads are read in place from qkv (row stride 3C): batched GEMMs over the heads of each
  // sample, no head permutes.
  for (std::int64_t b = 0; b < B; ++b) {
    const float* q = qkv.data() + b * T * 3 * C;
    // scores (T, T) = q_h (T, hs) k_h^T; the 1/sqrt(hs) scale is applied in the softmax
    gemm_strided_batched(Trans::N, Trans::T, T, T, hs, 1.f, q, 3 * C, hs, q + C, 3 * C, hs, 0.f,
                         att.data() + b * nh * T * T, T, T * T, nh);
  }
  masked_softmax_forward(att, B * nh, T, nh, 1.f / dsqrt(static_cast<float>(hs)), mask);
  if (drop.active()) dropout_forward(att_drop, att, B * nh * T * T, drop);
  Kokkos::fence();
}

void attention_context(const FloatView& y, const FloatView& probs, const FloatView& qkv, const AttentionShape& s) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  for (std::int64_t b = 0; b < B; ++b) {
    const float* v = qkv.data() + b * T * 3 * C + 2 * C;
    // y_h (T, hs) = att_h (T, T) v_h (T, hs), written in place into y (row stride C)
    gemm_strided_batched(Trans::N, Trans::N, T, hs, T, 1.f, probs.data() + b * nh * T * T, T, T * T, v, 3 * C, hs,
                         0.f, y.data() + b * T * C, C, hs, nh);
  }
}

void attention_forward(const FloatView& y, const FloatView& qkv, const FloatView& att, const AttentionShape& s,
                       const DropoutSpec& drop, const FloatView& att_drop, const AttentionMask& mask) {
  attention_probs(att, att_drop, qkv, s, drop, mask);
  attention_context(y, drop.active() ? att_drop : att, qkv, s);
}

void attention_backward(const FloatView& dqkv, const FloatView& dy, const FloatView& qkv, const FloatView& att,
                        const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop,
                        const FloatView& att_drop, const AttentionMask& mask) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  const FloatView& probs = drop.active() ? att_drop : att;
  for (std::int64_t b = 0; b < B; ++b) {
    const float* q = qkv.data() + b * T * 3 * C;
    const float* dyb = dy.data() + b * T * C;
    float* dq = dqkv.data() + b * T * 3 * C;
    // datt_h (T, T) = dy_h (T, hs) v_h^T ; dv_h (T, hs) = att_h^T dy_h
    gemm_strided_batched(Trans::N, Trans::T, T, T, hs, 1.f, dyb, C, hs, q + 2 * C, 3 * C, hs, 0.f,
                         datt.data() + b * nh * T * T, T, T * T, nh);
    gemm_strided_batched(Trans::T, Trans::N, T, hs, T, 1.f, probs.data() + b * nh * T * T, T, T * T, dyb, C, hs, 0.f,
                         dq + 2 * C, 3 * C, hs, nh);
  }
  if (drop.active()) dropout_backward(datt, datt, B * nh * T * T, drop);
  masked_softmax_backward(datt, att, B * nh, T, 1.f / dsqrt(static_cast<float>(hs)), mask.causal);
  Kokkos::fence();
  for (std::int64_t b = 0; b < B; ++b) {
    const float* q = qkv.data() + b * T * 3 * C;
    float* dq = dqkv.data() + b * T * 3 * C;
    const float* ds = datt.data() + b * nh * T * T;
    // dq_h = dscores_h k_h ; dk_h = dscores_h^T q_h
    gemm_strided_batched(Trans::N, Trans::N, T, hs, T, 1.f, ds, T, T * T, q + C, 3 * C, hs, 0.f, dq, 3 * C, hs, nh);
    gemm_strided_batched(Trans::T, Trans::N, T, hs, T, 1.f, ds, T, T * T, q, 3 * C, hs, 0.f, dq + C, 3 * C, hs, nh);
  }
}

void attention_probs_half(DType dt, const HalfView& att, const HalfView& att_drop, const HalfView& qkv,
                          const FloatView& scores, const AttentionShape& s, const DropoutSpec& drop,
                          const AttentionMask& mask) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs(), A = B * nh * T * T;
  const GemmOperand q = operand(dt, qkv.data());
  for (std::int64_t b = 0; b < B; ++b)
    gemm_mixed_strided_batched(Trans::N, Trans::T, T, T, hs, 1.f, q.at(b * T * 3 * C), 3 * C, hs,
                               q.at(b * T * 3 * C + C), 3 * C, hs, 0.f, scores.data() + b * nh * T * T, T, T * T, nh);
  masked_softmax_forward(scores, B * nh, T, nh, 1.f / dsqrt(static_cast<float>(hs)), mask);
  pack_half(dt, att, scores, A);
  if (drop.active()) {
    Kokkos::fence();
    dropout_forward(scores, scores, A, drop);
    pack_half(dt, att_drop, scores, A);
  }
  Kokkos::fence();
}

void attention_context_half(DType dt, const HalfView& y, const FloatView& y32, const HalfView& probs,
                            const HalfView& qkv, const AttentionShape& s) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs();
  const GemmOperand q = operand(dt, qkv.data()), p = operand(dt, probs.data());
  for (std::int64_t b = 0; b < B; ++b)
    gemm_mixed_strided_batched(Trans::N, Trans::N, T, hs, T, 1.f, p.at(b * nh * T * T), T, T * T,
                               q.at(b * T * 3 * C + 2 * C), 3 * C, hs, 0.f, y32.data() + b * T * C, C, hs, nh);
  pack_half(dt, y, y32, B * T * C);
  Kokkos::fence();
}

void attention_backward_half(DType dt, const FloatView& dqkv, const FloatView& dy, const HalfView& qkv,
                             const HalfView& att, const HalfView& att_drop, const FloatView& datt,
                             const FloatView& att32, const HalfView& dy16, const HalfView& ds16,
                             const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask) {
  const std::int64_t B = s.B, T = s.T, C = s.C, nh = s.nh, hs = s.hs(), A = B * nh * T * T;
  pack_half(dt, dy16, dy, B * T * C);
  Kokkos::fence();
  const GemmOperand q = operand(dt, qkv.data()), g = operand(dt, dy16.data());
  const GemmOperand probs = operand(dt, (drop.active() ? att_drop : att).data());
  for (std::int64_t b = 0; b < B; ++b) {
    // datt_h (T, T) = dy_h v_h^T ; dv_h (T, hs) = probs_h^T dy_h
    gemm_mixed_strided_batched(Trans::N, Trans::T, T, T, hs, 1.f, g.at(b * T * C), C, hs,
                               q.at(b * T * 3 * C + 2 * C), 3 * C, hs, 0.f, datt.data() + b * nh * T * T, T, T * T, nh);
    gemm_mixed_strided_batched(Trans::T, Trans::N, T, hs, T, 1.f, probs.at(b * nh * T * T), T, T * T, g.at(b * T * C),
                               C, hs, 0.f, dqkv.data() + b * T * 3 * C + 2 * C, 3 * C, hs, nh);
  }
  if (drop.active()) dropout_backward(datt, datt, A, drop);
  unpack_half(dt, att32, att, A);  // the stored (rounded) probabilities
  Kokkos::fence();
  masked_softmax_backward(datt, att32, B * nh, T, 1.f / dsqrt(static_cast<float>(hs)), mask.causal);
  pack_half(dt, ds16, datt, A);
  Kokkos::fence();
  const GemmOperand ds = operand(dt, ds16.data());
  for (std::int64_t b = 0; b < B; ++b) {
    float* dq = dqkv.data() + b * T * 3 * C;
    // dq_h = dscores_h k_h ; dk_h = dscores_h^T q_h
    gemm_mixed_strided_batched(Trans::N, Trans::N, T, hs, T, 1.f, ds.at(b * nh * T * T), T, T * T,
                               q.at(b * T * 3 * C + C), 3 * C, hs, 0.f, dq, 3 * C, hs, nh);
    gemm_mixed_strided_batched(Trans::T, Trans::N, T, hs, T, 1.f, ds.at(b * nh * T * T), T, T * T,
                               q.at(b * T * 3 * C), 3 * C, hs, 0.f, dq + C, 3 * C, hs, nh);
  }
}

}  // namespace trident
