// Core attention forward/backward. Self-attention (q, k and v packed per token) and
// cross-attention (queries from one sequence, keys and values from another) share one
// implementation over operands addressed by base pointer and row stride.
#include "ops/attention.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"
#include "ops/gemm.hpp"
#include "ops/mixed_precision.hpp"

#include <initializer_list>
#include <string>

namespace trident {

namespace {
// The masked softmax's device kernel, a warp per row in 16-byte groups (packed: rows_packed over the
// kernel's arrays): the exponentials written into att, then write(index, cnt, probabilities) for
// every group of the row (0 past the causal end); each lane reads back the exponentials it wrote
// (for_each_row's loops give a group to the same lane).
template <class Write>
void device_softmax_rows(const char* name, const FloatView& att, std::int64_t BH, std::int64_t Tq, std::int64_t Tk,
                         std::int64_t nh, float scale, const AttentionMask& mask, bool packed, const Write& write) {
  const bool causal = mask.causal, padded = mask.key_valid.extent(0) > 0, docs = mask.doc_start.extent(0) > 0;
  const IntView valid = mask.key_valid, doc = mask.doc_start;
  float* ad = att.data();
  for_each_row(
      name, BH * Tq, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t r) {
        const std::int64_t i = r % Tq, base = r * Tk, key0 = (r / (nh * Tq)) * Tk;
        const std::int64_t jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
        const std::int64_t jbeg = docs ? static_cast<std::int64_t>(doc((r / (nh * Tq)) * Tq + i)) : 0;
        auto on = [&](std::int64_t j) { return j >= jbeg && (!padded || valid(key0 + j) != 0); };
        const float mx = row_max_groups(t, jend, [&](std::int64_t c0, int cnt) {
          float v[kGroup];
          load_group<F32Fmt>(ad + base + c0, cnt, packed, v);
          float m = -3.0e38f;
          for (int k = 0; k < cnt; ++k)
            if (on(c0 + k)) m = dmax(m, v[k] * scale);
          return m;
        });
        const float any = row_sum_groups(t, jend, [&](std::int64_t c0, int cnt) {
          float n = 0.f;
          for (int k = 0; k < cnt; ++k) n += on(c0 + k) ? 1.f : 0.f;
          return n;
        });
        const float sum = row_sum_groups(t, jend, [&](std::int64_t c0, int cnt) {
          float v[kGroup];
          load_group<F32Fmt>(ad + base + c0, cnt, packed, v);
          float s = 0.f;
          for (int k = 0; k < cnt; ++k) {
            v[k] = on(c0 + k) ? fast_exp(v[k] * scale - mx) : 0.f;
            s += v[k];
          }
          store_group<F32Fmt>(ad + base + c0, cnt, packed, v);
          return s;
        });
        const float inv = any > 0.f ? 1.f / sum : 0.f;
        row_for_groups(t, Tk, [&](std::int64_t c0, int cnt) {
          float v[kGroup];
          load_group<F32Fmt>(ad + base + c0, cnt, packed, v);
          for (int k = 0; k < kGroup; ++k) v[k] = c0 + k < jend ? v[k] * inv : 0.f;
          write(base + c0, cnt, v);
        });
      });
}
}  // namespace

void masked_softmax_forward(const FloatView& att, std::int64_t BH, std::int64_t Tq, std::int64_t Tk, std::int64_t nh,
                            float scale, const AttentionMask& mask) {
  const bool causal = mask.causal, padded = mask.key_valid.extent(0) > 0, docs = mask.doc_start.extent(0) > 0;
  const IntView valid = mask.key_valid, doc = mask.doc_start;
  if constexpr (kDeviceKernels) {  // a warp per row (common/device_parallel.hpp)
    float* ad = att.data();
    const bool packed = rows_packed(Tk, ad);
    device_softmax_rows(
        "ops::masked_softmax_forward", att, BH, Tq, Tk, nh, scale, mask, packed,
        KOKKOS_LAMBDA(std::int64_t i0, int cnt, const float(&v)[kGroup]) {
          store_group<F32Fmt>(ad + i0, cnt, packed, v);
        });
    return;
  }
  for_each_index(
      "ops::masked_softmax_forward", BH * Tq, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t i = r % Tq, base = r * Tk, key0 = (r / (nh * Tq)) * Tk;  // first key of the sample
        const std::int64_t jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
        const std::int64_t jbeg = docs ? static_cast<std::int64_t>(doc((r / (nh * Tq)) * Tq + i)) : 0;
        auto on = [&](std::int64_t j) { return j >= jbeg && (!padded || valid(key0 + j) != 0); };
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
  if constexpr (kDeviceKernels) {  // a warp per row in 16-byte groups (common/device_parallel.hpp)
    float* dd = datt.data();
    const float* ad = att.data();
    const bool packed = rows_packed(Tk, dd, ad);
    for_each_row(
        "ops::masked_softmax_backward", BH * Tq, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t r) {
          const std::int64_t i = r % Tq, base = r * Tk, jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
          // each lane overwrites only the groups of datt it read (for_each_row's loops)
          const float dot = row_sum_groups(t, jend, [&](std::int64_t c0, int cnt) {
            float g[kGroup], a[kGroup];
            load_group<F32Fmt>(dd + base + c0, cnt, packed, g);
            load_group<F32Fmt>(ad + base + c0, cnt, packed, a);
            float s = 0.f;
            for (int k = 0; k < cnt; ++k) s += g[k] * a[k];
            return s;
          });
          row_for_groups(t, Tk, [&](std::int64_t c0, int cnt) {
            float g[kGroup], a[kGroup];
            load_group<F32Fmt>(dd + base + c0, cnt, packed, g);
            load_group<F32Fmt>(ad + base + c0, cnt, packed, a);
            for (int k = 0; k < kGroup; ++k) g[k] = c0 + k < jend ? a[k] * (g[k] - dot) * scale : 0.f;
            store_group<F32Fmt>(dd + base + c0, cnt, packed, g);
          });
        });
    return;
  }
  for_each_index(
      "ops::masked_softmax_backward", BH * Tq, KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t i = r % Tq, base = r * Tk, jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
        float dot = 0.f;
        for (std::int64_t j = 0; j < jend; ++j) dot += datt(base + j) * att(base + j);
        // masked keys have att = 0, hence a zero gradient
        for (std::int64_t j = 0; j < jend; ++j) datt(base + j) = att(base + j) * (datt(base + j) - dot) * scale;
        for (std::int64_t j = jend; j < Tk; ++j) datt(base + j) = 0.f;
      });
}

namespace {
template <class F>
void softmax_forward_half(const FloatView& att, const HalfView& a16, const HalfView& d16, std::int64_t BH,
                          std::int64_t Tq, std::int64_t Tk, std::int64_t nh, float scale, const AttentionMask& mask,
                          const DropoutSpec& drop) {
  const bool dropping = drop.active();
  const float p = drop.p, dscale = dropping ? 1.f / (1.f - drop.p) : 1.f;
  const std::uint64_t key = drop.key;
  // masked_softmax_forward's device kernel, its probabilities stored rounded, and dropped out
  std::uint16_t *a16d = a16.data(), *d16d = d16.data();
  const bool packed = rows_packed(Tk, att.data(), a16d) && (!dropping || aligned16(d16d));
  device_softmax_rows(
      "ops::masked_softmax_forward_half", att, BH, Tq, Tk, nh, scale, mask, packed,
      KOKKOS_LAMBDA(std::int64_t i0, int cnt, const float(&v)[kGroup]) {
        store_group<F>(a16d + i0, cnt, packed, v);
        if (!dropping) return;
        float dv[kGroup];
        for (int k = 0; k < kGroup; ++k)
          dv[k] = dropout_uniform(key, static_cast<std::uint64_t>(i0 + k)) >= p ? v[k] * dscale : 0.f;
        store_group<F>(d16d + i0, cnt, packed, dv);
      });
}

template <class F>
void softmax_backward_half(const FloatView& datt, const HalfView& a16, const HalfView& ds16, std::int64_t BH,
                           std::int64_t Tq, std::int64_t Tk, float scale, bool causal, const DropoutSpec& drop) {
  const bool dropping = drop.active();
  const float p = drop.p, dscale = dropping ? 1.f / (1.f - drop.p) : 1.f;
  const std::uint64_t key = drop.key;
  // dropout_backward, then masked_softmax_backward's device kernel on the stored probabilities, a
  // warp per row in 16-byte groups
  const float* dd = datt.data();
  const std::uint16_t* a16d = a16.data();
  std::uint16_t* ds16d = ds16.data();
  const bool packed = rows_packed(Tk, dd, a16d, ds16d);
  for_each_row(
      "ops::masked_softmax_backward_half", BH * Tq, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t r) {
        const std::int64_t i = r % Tq, base = r * Tk, jend = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
        // the group's incoming gradient after dropout's backward, and its stored probabilities
        auto load = [&](std::int64_t c0, int cnt, float(&g)[kGroup], float(&a)[kGroup]) {
          load_group<F32Fmt>(dd + base + c0, cnt, packed, g);
          load_group<F>(a16d + base + c0, cnt, packed, a);
          if (dropping)
            for (int k = 0; k < kGroup; ++k)
              g[k] = dropout_uniform(key, static_cast<std::uint64_t>(base + c0 + k)) >= p ? g[k] * dscale : 0.f;
        };
        const float dot = row_sum_groups(t, jend, [&](std::int64_t c0, int cnt) {
          float g[kGroup], a[kGroup];
          load(c0, cnt, g, a);
          float s = 0.f;
          for (int k = 0; k < cnt; ++k) s += g[k] * a[k];
          return s;
        });
        row_for_groups(t, Tk, [&](std::int64_t c0, int cnt) {
          float g[kGroup], a[kGroup];
          load(c0, cnt, g, a);
          for (int k = 0; k < kGroup; ++k) g[k] = c0 + k < jend ? a[k] * (g[k] - dot) * scale : 0.f;
          store_group<F>(ds16d + base + c0, cnt, packed, g);
        });
      });
}
}  // namespace

void masked_softmax_forward_half(DType dt, const FloatView& scores, const HalfView& att16, const HalfView& att_drop16,
                                 std::int64_t BH, std::int64_t Tq, std::int64_t Tk, std::int64_t nh, float scale,
                                 const AttentionMask& mask, const DropoutSpec& drop) {
  TRIDENT_REQUIRE(!drop.mapped(), "internal: the 16-bit softmax kernels take unmapped dropout");
  if constexpr (kDeviceKernels) {
    if (dt == DType::BF16)
      softmax_forward_half<Bf16Fmt>(scores, att16, att_drop16, BH, Tq, Tk, nh, scale, mask, drop);
    else if (dt == DType::F16)
      softmax_forward_half<Fp16Fmt>(scores, att16, att_drop16, BH, Tq, Tk, nh, scale, mask, drop);
    else
      throw Error::one("internal: masked_softmax_forward_half with dtype fp32");
    return;
  }
  const std::int64_t A = BH * Tq * Tk;
  masked_softmax_forward(scores, BH, Tq, Tk, nh, scale, mask);
  pack_half(dt, att16, scores, A);
  if (drop.active()) {
    dropout_forward(scores, scores, A, drop);
    pack_half(dt, att_drop16, scores, A);
  }
}

void masked_softmax_backward_half(DType dt, const FloatView& datt, const HalfView& att16, const HalfView& ds16,
                                  std::int64_t BH, std::int64_t Tq, std::int64_t Tk, float scale, bool causal,
                                  const DropoutSpec& drop) {
  TRIDENT_REQUIRE(!drop.mapped(), "internal: the 16-bit softmax kernels take unmapped dropout");
  if constexpr (kDeviceKernels) {
    if (dt == DType::BF16)
      softmax_backward_half<Bf16Fmt>(datt, att16, ds16, BH, Tq, Tk, scale, causal, drop);
    else if (dt == DType::F16)
      softmax_backward_half<Fp16Fmt>(datt, att16, ds16, BH, Tq, Tk, scale, causal, drop);
    else
      throw Error::one("internal: masked_softmax_backward_half with dtype fp32");
    return;
  }
  const std::int64_t A = BH * Tq * Tk;
  if (drop.active()) dropout_backward(datt, datt, A, drop);
  const FloatView att32 = make_float("attention::att32", A);
  unpack_half(dt, att32, att16, A);
  masked_softmax_backward(datt, att32, BH, Tq, Tk, scale, causal);
  pack_half(dt, ds16, datt, A);
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

// self-attention: rows [q (C) | k (Ckv) | v (Ckv)]
Operands packed(DType dt, const void* qkv, const AttentionShape& s) {
  const GemmOperand base{dt, qkv};
  const std::int64_t C = s.C, Ckv = s.kv_C(), ld = C + 2 * Ckv;
  return {base, base.at(C), base.at(C + Ckv), ld, ld, ld};
}
GradOperands packed_grad(float* dqkv, const AttentionShape& s) {
  const std::int64_t C = s.C, Ckv = s.kv_C(), ld = C + 2 * Ckv;
  return {dqkv, dqkv + C, dqkv + C + Ckv, ld, ld, ld};
}
// cross-attention: q (C) rows, kv rows [k (Ckv) | v (Ckv)]
Operands crossed(DType dt, const void* q, const void* kv, const AttentionShape& s) {
  const GemmOperand k{dt, kv};
  const std::int64_t Ckv = s.kv_C();
  return {GemmOperand{dt, q}, k, k.at(Ckv), s.C, 2 * Ckv, 2 * Ckv};
}
GradOperands crossed_grad(float* dq, float* dkv, const AttentionShape& s) {
  const std::int64_t Ckv = s.kv_C();
  return {dq, dkv, dkv + Ckv, s.C, 2 * Ckv, 2 * Ckv};
}

std::int64_t probs_size(const AttentionShape& s) { return s.B * s.nh * s.T * s.keys(); }
float softmax_scale(const AttentionShape& s) { return 1.f / dsqrt(static_cast<float>(s.hs())); }

// The per-head GEMMs of a micro-batch are one batched call each (gemm_mixed_batched). Query head
// h = g rep + t reads key/value group g; the batch's levels are the sample b, the head's place t
// in its group and, innermost, the group g (query and probability strides rep heads, key and value
// strides one group; a host build runs each (b, t) as one strided batch over the groups, as
// before). Without grouped-query attention (rep 1) that is a batch over samples and heads. The key
// and value gradients of a group sum over its rep query heads: one call per t over (b, g), beta 1
// after the first.

// scores (B, nh, Tq, Tk) = q_h k_g^T per sample (the 1/sqrt(hs) scale is applied in the softmax)
void scores_gemm(float* scores, const Operands& o, const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs(), ng = s.groups(), rep = s.rep();
  const GemmBatch batch{
      {{s.B, Tq * o.ldq, s.kv_rows() * o.ldk, nh * Tq * Tk}, {rep, hs, 0, Tq * Tk}, {ng, rep * hs, hs, rep * Tq * Tk}}};
  gemm_mixed_batched(Trans::N, Trans::T, Tq, Tk, hs, 1.f, o.q, o.ldq, o.k, o.ldk, 0.f, scores, Tk, batch);
}

// y_h (Tq, hs) = probs_h (Tq, Tk) v_g (Tk, hs), written in place into y (row stride C)
void context_gemm(float* y, GemmOperand probs, const Operands& o, const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs(), C = s.C, ng = s.groups(), rep = s.rep();
  const GemmBatch batch{
      {{s.B, nh * Tq * Tk, s.kv_rows() * o.ldv, Tq * C}, {rep, Tq * Tk, 0, hs}, {ng, rep * Tq * Tk, hs, rep * hs}}};
  gemm_mixed_batched(Trans::N, Trans::N, Tq, hs, Tk, 1.f, probs, Tk, o.v, o.ldv, 0.f, y, C, batch);
}

// datt_h (Tq, Tk) = dy_h v_g^T ; dv_g (Tk, hs) = sum over the group's heads of probs_h^T dy_h
void value_grad_gemms(float* datt, const GradOperands& g, GemmOperand dy, GemmOperand probs, const Operands& o,
                      const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs(), C = s.C, ng = s.groups(), rep = s.rep();
  const GemmBatch datt_batch{
      {{s.B, Tq * C, s.kv_rows() * o.ldv, nh * Tq * Tk}, {rep, hs, 0, Tq * Tk}, {ng, rep * hs, hs, rep * Tq * Tk}}};
  gemm_mixed_batched(Trans::N, Trans::T, Tq, Tk, hs, 1.f, dy, C, o.v, o.ldv, 0.f, datt, Tk, datt_batch);
  const GemmBatch dv_batch{{{s.B, nh * Tq * Tk, Tq * C, s.kv_rows() * g.ldv}, {ng, rep * Tq * Tk, rep * hs, hs}}};
  for (std::int64_t t = 0; t < rep; ++t)
    gemm_mixed_batched(Trans::T, Trans::N, Tk, hs, Tq, 1.f, probs.at(t * Tq * Tk), Tk, dy.at(t * hs), C,
                       t == 0 ? 0.f : 1.f, g.dv, g.ldv, dv_batch);
}

// dq_h (Tq, hs) = dscores_h k_g ; dk_g (Tk, hs) = sum over the group's heads of dscores_h^T q_h
void query_key_grad_gemms(const GradOperands& g, GemmOperand ds, const Operands& o, const AttentionShape& s) {
  const std::int64_t Tq = s.T, Tk = s.keys(), nh = s.nh, hs = s.hs(), ng = s.groups(), rep = s.rep();
  const GemmBatch dq_batch{
      {{s.B, nh * Tq * Tk, s.kv_rows() * o.ldk, Tq * g.ldq}, {rep, Tq * Tk, 0, hs}, {ng, rep * Tq * Tk, hs, rep * hs}}};
  gemm_mixed_batched(Trans::N, Trans::N, Tq, hs, Tk, 1.f, ds, Tk, o.k, o.ldk, 0.f, g.dq, g.ldq, dq_batch);
  const GemmBatch dk_batch{{{s.B, nh * Tq * Tk, Tq * o.ldq, s.kv_rows() * g.ldk}, {ng, rep * Tq * Tk, rep * hs, hs}}};
  for (std::int64_t t = 0; t < rep; ++t)
    gemm_mixed_batched(Trans::T, Trans::N, Tk, hs, Tq, 1.f, ds.at(t * Tq * Tk), Tk, o.q.at(t * hs), o.ldq,
                       t == 0 ? 0.f : 1.f, g.dk, g.ldk, dk_batch);
}

void probs_f32(const FloatView& att, const FloatView& att_drop, const Operands& o, const AttentionShape& s,
               const DropoutSpec& drop, const AttentionMask& mask) {
  scores_gemm(att.data(), o, s);
  masked_softmax_forward(att, s.B * s.nh, s.T, s.keys(), s.nh, softmax_scale(s), mask);
  if (drop.active()) dropout_forward(att_drop, att, probs_size(s), drop);
}

void backward_f32(const GradOperands& g, const FloatView& dy, const Operands& o, const FloatView& att,
                  const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop, const FloatView& att_drop,
                  const AttentionMask& mask) {
  const FloatView& probs = drop.active() ? att_drop : att;
  value_grad_gemms(datt.data(), g, operand(dy.data()), operand(probs.data()), o, s);
  if (drop.active()) dropout_backward(datt, datt, probs_size(s), drop);
  masked_softmax_backward(datt, att, s.B * s.nh, s.T, s.keys(), softmax_scale(s), mask.causal);
  query_key_grad_gemms(g, operand(datt.data()), o, s);
}

void probs_half(DType dt, const HalfView& att, const HalfView& att_drop, const Operands& o, const FloatView& scores,
                const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask) {
  const std::int64_t A = probs_size(s);
  scores_gemm(scores.data(), o, s);
  if (kDeviceKernels && !drop.mapped()) {  // one kernel for the softmax, the dropout and their rounding
    masked_softmax_forward_half(dt, scores, att, att_drop, s.B * s.nh, s.T, s.keys(), s.nh, softmax_scale(s), mask,
                                drop);
    return;
  }
  masked_softmax_forward(scores, s.B * s.nh, s.T, s.keys(), s.nh, softmax_scale(s), mask);
  pack_half(dt, att, scores, A);
  if (drop.active()) {
    dropout_forward(scores, scores, A, drop);
    pack_half(dt, att_drop, scores, A);
  }
}

void context_half(DType dt, const HalfView& y, const FloatView& y32, const HalfView& probs, const Operands& o,
                  const AttentionShape& s) {
  context_gemm(y32.data(), operand(dt, probs.data()), o, s);
  pack_half(dt, y, y32, s.B * s.T * s.C);
}

void backward_half(DType dt, const GradOperands& g, const FloatView& dy, const Operands& o, const HalfView& att,
                   const HalfView& att_drop, const FloatView& datt, const FloatView& att32, const HalfView& dy16,
                   const HalfView& ds16, const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask) {
  const std::int64_t A = probs_size(s);
  pack_half(dt, dy16, dy, s.B * s.T * s.C);
  value_grad_gemms(datt.data(), g, operand(dt, dy16.data()), operand(dt, (drop.active() ? att_drop : att).data()), o,
                   s);
  if (kDeviceKernels && !drop.mapped()) {  // one kernel for the dropout's and the softmax's backward
    masked_softmax_backward_half(dt, datt, att, ds16, s.B * s.nh, s.T, s.keys(), softmax_scale(s), mask.causal, drop);
    query_key_grad_gemms(g, operand(dt, ds16.data()), o, s);
    return;
  }
  if (drop.active()) dropout_backward(datt, datt, A, drop);
  unpack_half(dt, att32, att, A);  // the stored (rounded) probabilities
  masked_softmax_backward(datt, att32, s.B * s.nh, s.T, s.keys(), softmax_scale(s), mask.causal);
  pack_half(dt, ds16, datt, A);
  query_key_grad_gemms(g, operand(dt, ds16.data()), o, s);
}

}  // namespace

namespace {

// The API boundary: every activation of one call in one storage type, and the 16-bit path's
// scratch large enough.
DType common_dtype(const char* op, std::initializer_list<const Act*> acts) {
  DType dt = DType::F32;
  bool first = true;
  for (const Act* a : acts) {
    if (a->size() == 0) continue;  // an absent tensor (att_drop without dropout)
    if (!first && a->dt != dt)
      throw Error::one(std::string("internal: ") + op + " called with activations of different types (" +
                       dtype_name(dt) + ", " + dtype_name(a->dt) + ")");
    dt = a->dt;
    first = false;
  }
  return dt;
}
void require_scratch(const char* op, const char* name, std::int64_t have, std::int64_t need) {
  if (have < need)
    throw Error::one(std::string("internal: ") + op + ": 16-bit scratch " + name + " holds " + std::to_string(have) +
                     " values, " + std::to_string(need) + " needed");
}
std::int64_t extent(const FloatView& v) { return static_cast<std::int64_t>(v.extent(0)); }
std::int64_t extent(const HalfView& v) { return static_cast<std::int64_t>(v.extent(0)); }

void probs_any(const char* op, const Act& att, const Act& att_drop, const Operands& o, DType dt,
               const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask,
               const AttentionScratch& scratch) {
  if (dt == DType::F32) return probs_f32(att.f, att_drop.f, o, s, drop, mask);
  require_scratch(op, "scores", extent(scratch.scores), probs_size(s));
  probs_half(dt, att.h, att_drop.h, o, scratch.scores, s, drop, mask);
}

void context_any(const char* op, const Act& y, const Act& probs, const Operands& o, DType dt, const AttentionShape& s,
                 const AttentionScratch& scratch) {
  if (dt == DType::F32) return context_gemm(y.f.data(), operand(probs.f.data()), o, s);
  require_scratch(op, "y32", extent(scratch.y32), s.B * s.T * s.C);
  context_half(dt, y.h, scratch.y32, probs.h, o, s);
}

void backward_any(const char* op, const GradOperands& g, const FloatView& dy, const Operands& o, DType dt,
                  const Act& att, const Act& att_drop, const FloatView& datt, const AttentionShape& s,
                  const DropoutSpec& drop, const AttentionMask& mask, const AttentionScratch& scratch) {
  if (dt == DType::F32) return backward_f32(g, dy, o, att.f, datt, s, drop, att_drop.f, mask);
  require_scratch(op, "att32", extent(scratch.att32), probs_size(s));
  require_scratch(op, "ds16", extent(scratch.ds16), probs_size(s));
  require_scratch(op, "dy16", extent(scratch.dy16), s.B * s.T * s.C);
  backward_half(dt, g, dy, o, att.h, att_drop.h, datt, scratch.att32, scratch.dy16, scratch.ds16, s, drop, mask);
}

}  // namespace

// ---- self-attention, q|k|v packed per token

void attention_probs(const Act& att, const Act& att_drop, const Act& qkv, const AttentionShape& s,
                     const DropoutSpec& drop, const AttentionMask& mask, const AttentionScratch& scratch) {
  const DType dt = common_dtype("attention_probs", {&att, &att_drop, &qkv});
  probs_any("attention_probs", att, att_drop, packed(dt, qkv.data(), s), dt, s, drop, mask, scratch);
}

void attention_context(const Act& y, const Act& probs, const Act& qkv, const AttentionShape& s,
                       const AttentionScratch& scratch) {
  const DType dt = common_dtype("attention_context", {&y, &probs, &qkv});
  context_any("attention_context", y, probs, packed(dt, qkv.data(), s), dt, s, scratch);
}

void attention_forward(const FloatView& y, const FloatView& qkv, const FloatView& att, const AttentionShape& s,
                       const DropoutSpec& drop, const FloatView& att_drop, const AttentionMask& mask) {
  attention_probs(att, att_drop, qkv, s, drop, mask);
  attention_context(y, drop.active() ? att_drop : att, qkv, s);
}

void attention_backward(const FloatView& dqkv, const FloatView& dy, const Act& qkv, const Act& att, const Act& att_drop,
                        const FloatView& datt, const AttentionShape& s, const DropoutSpec& drop,
                        const AttentionMask& mask, const AttentionScratch& scratch) {
  const DType dt = common_dtype("attention_backward", {&qkv, &att, &att_drop});
  backward_any("attention_backward", packed_grad(dqkv.data(), s), dy, packed(dt, qkv.data(), s), dt, att, att_drop,
               datt, s, drop, mask, scratch);
}

// ---- cross-attention: q (B, T, C), k|v (B, Tk, 2C)

void cross_attention_probs(const Act& att, const Act& att_drop, const Act& q, const Act& kv, const AttentionShape& s,
                           const DropoutSpec& drop, const AttentionMask& mask, const AttentionScratch& scratch) {
  const DType dt = common_dtype("cross_attention_probs", {&att, &att_drop, &q, &kv});
  probs_any("cross_attention_probs", att, att_drop, crossed(dt, q.data(), kv.data(), s), dt, s, drop, mask, scratch);
}

void cross_attention_context(const Act& y, const Act& probs, const Act& kv, const AttentionShape& s,
                             const AttentionScratch& scratch) {
  const DType dt = common_dtype("cross_attention_context", {&y, &probs, &kv});
  context_any("cross_attention_context", y, probs, crossed(dt, nullptr, kv.data(), s), dt, s, scratch);
}

void cross_attention_backward(const FloatView& dq, const FloatView& dkv, const FloatView& dy, const Act& q,
                              const Act& kv, const Act& att, const Act& att_drop, const FloatView& datt,
                              const AttentionShape& s, const DropoutSpec& drop, const AttentionMask& mask,
                              const AttentionScratch& scratch) {
  const DType dt = common_dtype("cross_attention_backward", {&q, &kv, &att, &att_drop});
  backward_any("cross_attention_backward", crossed_grad(dq.data(), dkv.data(), s), dy,
               crossed(dt, q.data(), kv.data(), s), dt, att, att_drop, datt, s, drop, mask, scratch);
}

void kv_cache_store(const FloatView& q, const FloatView& cache, const FloatView& qkv, const IntView& positions,
                    std::int64_t R, std::int64_t n, std::int64_t L, std::int64_t C, std::int64_t Ckv) {
  const std::int64_t W = C + 2 * Ckv;  // a row of qkv
  for_each_index(
      "ops::kv_cache_store", R * W, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / W, c = i % W;
        if (c < C) {
          q(r * C + c) = qkv(i);
        } else {
          const std::int64_t b = r / n, at = (b * L + positions(r)) * 2 * Ckv;
          cache(at + c - C) = qkv(i);  // k then v
        }
      });
}

}  // namespace trident
