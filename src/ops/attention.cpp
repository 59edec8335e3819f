// Core attention forward/backward. Self-attention (q, k and v packed per token) and
// cross-attention (queries from one sequence, keys and values from another) share one
// implementation over operands addressed by base pointer and row stride.
#include "ops/attention.hpp"

#include "common/device_math.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

void masked_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t Tq, std::int64_t Tk,
                            std::int64_t nh, float scale, const AttentionMask& mask) {
  const bool causal = mask.causal, padded = mask.key_valid.extent(0) > 0;
  const IntView valid = mask.key_valid;
  Kokkos::parallel_for("ops::masked_softmax_forward", range(BH * Tq), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t i = r % Tq, base = r * Tk, key0 = (r / (nh * Tq)) * Tk;  // first key of the sample
    const std::int64_t jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
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
    for (std::int64_t j = jend; j < Tk; ++j) att(base + j) = 0.f;
  });
}

void masked_softmax_backward(const FloatView& datt, const FloatView& att, std::int64_t BH, std::int64_t Tq,
                             std::int64_t Tk, float scale, bool causal) {
  Kokkos::parallel_for("ops::masked_softmax_backward", range(BH * Tq), KOKKOS_LAMBDA(std::int64_t r) {
    const std::int64_t i = r % Tq, base = r * Tk, jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
    float dot = 0.f;
    for (std::int64_t j = 0; j < jend; ++j) dot += datt(base + j) * att(base + j);
    // masked keys have att = 0, hence a zero gradient
    for (std::int64_t j = 0; j < jend; ++j) datt(base + j) = att(base + j) * (datt(base + j) - dot) * scale;
    for (std::int64_t j = jend; j < Tk; ++j) datt(base + j) = 0.f;
  });
}

namespace {

// Where the heads of q, k and v live: head h of a token's row is the contiguous block
// h*hs..(h+1)*hs-1 from the operand's base; rows are `ld` apart, samples Tq (q) or Tk (k, v)
// rows apart.
struct Operands {
  GemmOperand q, k, v;
  std::int64_t ldq, ldk, ldv;
};
// The same for the gradients (fp32), written in place of the operands' layout.
struct GradOperands {
  float *dq, *dk, *dv;
  std::int64_t ldq, ldk, ldv;
};

Operands packed(DType dt, const void* qkv, std::int64_t C) {
  const GemmOperand base{dt, qkv};
  return {base, base.at(C), base.at(2 * C), 3 * C, 3 * C, 3 * C};
}
GradOperands packed_grad(float* dqkv, std::int64_t C) { return {dqkv, dqkv + C, dqkv + 2 * C, 3 * C, 3 * C, 3 * C}; }
Operands crossed(DType dt, const void* q, const void* kv, std::int64_t C) {
  const GemmOperand k{dt, kv};
  return {GemmOperand{dt, q}, k, k.at(C), C, 2 * C, 2 * C};
}
GradOperands crossed_grad(float* dq, float* dkv, std::int64_t C) { return {dq, dkv, dkv + C, C, 2 * C, 2 * C}; }

std::int64_t probs_size(const AttentionShape& s) { return s.B * s.nh * s.T * s.keys(); }
float softmax_scale(const AttentionShape& s) { return 1.f / dsqrt(static_cast<float>(s.hs())); }

// scores (B, nh, Tq, Tk) = q_h k_h^T per sample (the 1/sqrt(hs) scale is applied in the softmax)
void scores_gemm(float* scores, const Operands& o, const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs();
  for (std::int64_t b = 0; b < s.B; ++b)
    gemm_mixed_strided_batched(Trans::N, Trans::T, Tq, Tk, hs, 1.f, o.q.at(b * Tq * o.ldq), o.ldq, hs,
                               o.k.at(b * s.kv_rows() * o.ldk), o.ldk, hs, 0.f, scores + b * nh * Tq * Tk, Tk, Tq * Tk, nh);
}

// y_h (Tq, hs) = probs_h (Tq, Tk) v_h (Tk, hs), written in place into y (row stride C)
void context_gemm(float* y, GemmOperand probs, const Operands& o, const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs(), C = s.C;
  for (std::int64_t b = 0; b < s.B; ++b)
    gemm_mixed_strided_batched(Trans::N, Trans::N, Tq, hs, Tk, 1.f, probs.at(b * nh * Tq * Tk), Tk, Tq * Tk,
                               o.v.at(b * s.kv_rows() * o.ldv), o.ldv, hs, 0.f, y + b * Tq * C, C, hs, nh);
}

// datt_h (Tq, Tk) = dy_h v_h^T ; dv_h (Tk, hs) = probs_h^T dy_h
void value_grad_gemms(float* datt, const GradOperands& g, GemmOperand dy, GemmOperand probs, const Operands& o,
                      const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs(), C = s.C;
  for (std::int64_t b = 0; b < s.B; ++b) {
    gemm_mixed_strided_batched(Trans::N, Trans::T, Tq, Tk, hs, 1.f, dy.at(b * Tq * C), C, hs, o.v.at(b * s.kv_rows() * o.ldv),
                               o.ldv, hs, 0.f, datt + b * nh * Tq * Tk, Tk, Tq * Tk, nh);
    gemm_mixed_strided_batched(Trans::T, Trans::N, Tk, hs, Tq, 1.f, probs.at(b * nh * Tq * Tk), Tk, Tq * Tk,
                               dy.at(b * Tq * C), C, hs, 0.f, g.dv + b * s.kv_rows() * g.ldv, g.ldv, hs, nh);
  }
}

// dq_h (Tq, hs) = dscores_h k_h ; dk_h (Tk, hs) = dscores_h^T q_h
void query_key_grad_gemms(const GradOperands& g, GemmOperand ds, const Operands& o, const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs();
  for (std::int64_t b = 0; b < s.B; ++b) {
    gemm_mixed_strided_batched(Trans::N, Trans::N, Tq, hs, Tk, 1.f, ds.at(b * nh * Tq * Tk), Tk, Tq * Tk,
                               o.k.at(b * s.kv_rows() * o.ldk), o.ldk, hs, 0.f, g.dq + b * Tq * g.ldq, g.ldq, hs, nh);
    gemm_mixed_strided_batched(Trans::T, Trans::N, Tk, hs, Tq, 1.f, ds.at(b * nh * Tq * Tk), Tk, Tq * Tk,
                               o.q.at(b * Tq * o.ldq), o.ldq, hs, 0.f, g.dk + b * s.kv_rows() * g.ldk, g.ldk, hs, nh);
  }
}

void probs_f32(const FloatView& att, const FloatView& att_drop, const Operands& o, const AttentionShape& s,
               const DropoutSpec& drop, const AttentionMask& mask) {
  scores_gemm(att.data(), o, s);
  masked_softmax_forward(att, s.B * s.nh, s.T, s.keys(), s.nh, softmax_scale(s), mask);
  if (drop.active()) dropout_forward(att_drop, att, probs_size(s), drop);
  Kokkos::fence();
}

void backward_f32(const GradOperands& g, const FloatView& dy, const Operands& o, const FloatView& att,
                  const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop, const FloatView& att_drop,
                  const AttentionMask& mask) {
  const FloatView& probs = drop.active() ? att_drop : att;
  value_grad_gemms(datt.data(), g, operand(dy.data()), operand(probs.data()), o, s);
  if (drop.active()) dropout_backward(datt, datt, probs_size(s), drop);
  masked_softmax_backward(datt, att, s.B * s.nh, s.T, s.keys(), softmax_scale(s), mask.causal);
  Kokkos::fence();
  query_key_grad_gemms(g, operand(datt.data()), o, s);
}

void probs_half(DType dt, const HalfView& att, const HalfView& att_drop, const Operands& o,
                const FloatView& scores, const AttentionShape& s, const DropoutSpec& drop,
                const AttentionMask& mask) {
  const std::int64_t A = probs_size(s);
  scores_gemm(scores.data(), o, s);
  masked_softmax_forward(scores, s.B * s.nh, s.T, s.keys(), s.nh, softmax_scale(s), mask);
  pack_half(dt, att, scores, A);
  if (drop.active()) {
    Kokkos::fence();
    dropout_forward(scores, scores, A, drop);
    pack_half(dt, att_drop, scores, A);
  }
  Kokkos::fence();
}

void context_half(DType dt, const HalfView& y, const FloatView& y32, const HalfView& probs, const Operands& o,
                  const AttentionShape& s) {
  context_gemm(y32.data(), operand(dt, probs.data()), o, s);
  pack_half(dt, y, y32, s.B * s.T * s.C);
  Kokkos::fence();
}

void backward_half(DType dt, const GradOperands& g, const FloatView& dy, const Operands& o, const HalfView& att,
                   const HalfView& att_drop, const FloatView& datt, const FloatView& att32, const HalfView& dy16,
                   const HalfView& ds16, const AttentionShape& s, const DropoutSpec& drop,
                   const AttentionMask& mask) {
  const std::int64_t A = probs_size(s);
  pack_half(dt, dy16, dy, s.B * s.T * s.C);
  Kokkos::fence();
  value_grad_gemms(datt.data(), g, operand(dt, dy16.data()), operand(dt, (drop.active() ? att_drop : att).data()), o,
                   s);
  if (drop.active()) dropout_backward(datt, datt, A, drop);
  unpack_half(dt, att32, att, A);  // the stored (rounded) probabilities
  Kokkos::fence();
  masked_softmax_backward(datt, att32, s.B * s.nh, s.T, s.keys(), softmax_scale(s), mask.causal);
  pack_half(dt, ds16, datt, A);
  Kokkos::fence();
  query_key_grad_gemms(g, operand(dt, ds16.data()), o, s);
}

}  // namespace

// ---- self-attention, q|k|v packed per token

void attention_probs(const FloatView& att, const FloatView& att_drop, const FloatView& qkv, const AttentionShape& s,
                     const DropoutSpec& drop, const AttentionMask& mask) {
  probs_f32(att, att_drop, packed(DType::F32, qkv.data(), s.C), s, drop, mask);
}

void attention_context(const FloatView& y, const FloatView& probs, const FloatView& qkv, const AttentionShape& s) {
  context_gemm(y.data(), operand(probs.data()), packed(DType::F32, qkv.data(), s.C), s);
}

void attention_forward(const FloatView& y, const FloatView& qkv, const FloatView& att, const AttentionShape& s,
                       const DropoutSpec& drop, const FloatView& att_drop, const AttentionMask& mask) {
  attention_probs(att, att_drop, qkv, s, drop, mask);
  attention_context(y, drop.active() ? att_drop : att, qkv, s);
}

void attention_backward(const FloatView& dqkv, const FloatView& dy, const FloatView& qkv, const FloatView& att,
                        const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop,
                        const FloatView& att_drop, const AttentionMask& mask) {
  backward_f32(packed_grad(dqkv.data(), s.C), dy, packed(DType::F32, qkv.data(), s.C), att, datt, s, drop, att_drop,
               mask);
}

void attention_probs_half(DType dt, const HalfView& att, const HalfView& att_drop, const HalfView& qkv,
                          const FloatView& scores, const AttentionShape& s, const DropoutSpec& drop,
                          const AttentionMask& mask) {
  probs_half(dt, att, att_drop, packed(dt, qkv.data(), s.C), scores, s, drop, mask);
}

void attention_context_half(DType dt, const HalfView& y, const FloatView& y32, const HalfView& probs,
                            const HalfView& qkv, const AttentionShape& s) {
  context_half(dt, y, y32, probs, packed(dt, qkv.data(), s.C), s);
}

void attention_backward_half(DType dt, const FloatView& dqkv, const FloatView& dy, const HalfView& qkv,
                             const HalfView& att, const HalfView& att_drop, const FloatView& datt,
                             const FloatView& att32, const HalfView& dy16, const HalfView& ds16,
                             const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask) {
  backward_half(dt, packed_grad(dqkv.data(), s.C), dy, packed(dt, qkv.data(), s.C), att, att_drop, datt, att32, dy16,
                ds16, s, drop, mask);
}

// ---- cross-attention: q (B, T, C), k|v (B, Tk, 2C)

void cross_attention_probs(const FloatView& att, const FloatView& att_drop, const FloatView& q, const FloatView& kv,
                           const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask) {
  probs_f32(att, att_drop, crossed(DType::F32, q.data(), kv.data(), s.C), s, drop, mask);
}

void cross_attention_context(const FloatView& y, const FloatView& probs, const FloatView& kv,
                             const AttentionShape& s) {
  context_gemm(y.data(), operand(probs.data()), crossed(DType::F32, nullptr, kv.data(), s.C), s);
}

void cross_attention_backward(const FloatView& dq, const FloatView& dkv, const FloatView& dy, const FloatView& q,
                              const FloatView& kv, const FloatView& att, const FloatView& datt,
                              const AttentionShape& s, const DropoutSpec& drop, const FloatView& att_drop,
                              const AttentionMask& mask) {
  backward_f32(crossed_grad(dq.data(), dkv.data(), s.C), dy, crossed(DType::F32, q.data(), kv.data(), s.C), att, datt,
               s, drop, att_drop, mask);
}

void cross_attention_probs_half(DType dt, const HalfView& att, const HalfView& att_drop, const HalfView& q,
                                const HalfView& kv, const FloatView& scores, const AttentionShape& s,
                                const DropoutSpec& drop, const AttentionMask& mask) {
  probs_half(dt, att, att_drop, crossed(dt, q.data(), kv.data(), s.C), scores, s, drop, mask);
}

void cross_attention_context_half(DType dt, const HalfView& y, const FloatView& y32, const HalfView& probs,
                                  const HalfView& kv, const AttentionShape& s) {
  context_half(dt, y, y32, probs, crossed(dt, nullptr, kv.data(), s.C), s);
}

void cross_attention_backward_half(DType dt, const FloatView& dq, const FloatView& dkv, const FloatView& dy,
                                   const HalfView& q, const HalfView& kv, const HalfView& att,
                                   const HalfView& att_drop, const FloatView& datt, const FloatView& att32,
                                   const HalfView& dy16, const HalfView& ds16, const AttentionShape& s,
                                   const DropoutSpec& drop, const AttentionMask& mask) {
  backward_half(dt, crossed_grad(dq.data(), dkv.data(), s.C), dy, crossed(dt, q.data(), kv.data(), s.C), att,
                att_drop, datt, att32, dy16, ds16, s, drop, mask);
}

}  // namespace trident
