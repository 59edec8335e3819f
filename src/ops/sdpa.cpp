// sdpa (sdpa.hpp): the plan on every backend, the host's stand-in for cuDNN, and the CUDA build's
// calls into ops/sdpa_cudnn_cuda.cpp.
#include "ops/sdpa.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "ops/gemm_region.hpp"

namespace trident {

std::string SdpaPlan::key() const {
  std::ostringstream out;
  out << (bf16 ? "bf16" : "fp16") << " b" << b << " hq" << h_q << " hkv" << h_kv << " s" << s << " d" << d;
  const SdpaTensor* ts[] = {&q, &k, &v, &o, &stats};
  for (const SdpaTensor* t : ts) {
    out << " [";
    for (int i = 0; i < 4; ++i) out << t->dim[i] << ':' << t->stride[i] << (i < 3 ? "," : "");
    out << '+' << t->offset << ']';
  }
  out << " scale" << scale << " causal" << causal << " dropout" << dropout << " padded" << padded;
  return out.str();
}

bool SdpaPlan::same_graph(const SdpaPlan& o) const {
  const auto same = [](const SdpaTensor& a, const SdpaTensor& b) {
    for (int i = 0; i < 4; ++i)
      if (a.dim[i] != b.dim[i] || a.stride[i] != b.stride[i]) return false;
    return a.offset == b.offset;
  };
  return bf16 == o.bf16 && b == o.b && h_q == o.h_q && h_kv == o.h_kv && s == o.s && d == o.d && same(q, o.q) &&
         same(k, o.k) && same(v, o.v) && same(this->o, o.o) && same(stats, o.stats) && scale == o.scale &&
         causal == o.causal && dropout == o.dropout && padded == o.padded;
}

SdpaPlan sdpa_plan(const AttentionShape& s, DType dt, bool causal, float dropout, bool padded) {
  SdpaPlan p;
  std::ostringstream why;
  const std::int64_t d = s.hs(), W = s.C + 2 * s.kv_C();
  if (dt == DType::F32)
    why << "fp32 attention (cuDNN's fused attention takes bf16 or fp16)";
  else if (s.Tk > 0 || s.kv_stride > 0)
    why << "cross-attention (the cudnn entry serves self-attention)";
  else if (s.nh % s.groups() != 0)
    why << s.nh << " query heads in " << s.groups() << " key/value groups";
  else if (d % 8 != 0 || d > 128)
    why << "head size " << d << " (cuDNN's fused attention on sm_90 takes multiples of 8 up to 128)";
  if (!why.str().empty()) {
    p.error = why.str();
    return p;
  }
  p.bf16 = dt == DType::BF16;
  p.b = s.B;
  p.h_q = s.nh;
  p.h_kv = s.groups();
  p.s = s.T;
  p.d = d;
  // (b, h, s, d) over a row-major (B, T, width) buffer whose heads are d-channel blocks from `first`
  const auto heads = [&](std::int64_t h, std::int64_t width, std::int64_t first) {
    SdpaTensor t;
    const std::int64_t dim[4] = {s.B, h, s.T, d}, stride[4] = {s.T * width, d, width, 1};
    for (int i = 0; i < 4; ++i) {
      t.dim[i] = dim[i];
      t.stride[i] = stride[i];
    }
    t.offset = first;
    return t;
  };
  p.q = heads(s.nh, W, 0);
  p.k = heads(s.groups(), W, s.C);
  p.v = heads(s.groups(), W, s.C + s.kv_C());
  p.o = heads(s.nh, s.C, 0);
  const std::int64_t sd[4] = {s.B, s.nh, s.T, 1}, ss[4] = {s.nh * s.T, s.T, 1, 1};
  for (int i = 0; i < 4; ++i) {
    p.stats.dim[i] = sd[i];
    p.stats.stride[i] = ss[i];
  }
  p.scale = 1.f / std::sqrt(static_cast<float>(d));
  p.causal = causal;
  p.dropout = dropout;
  p.padded = padded;
  return p;
}

std::string sdpa_mask_error(const AttentionMask& mask) {
  if (mask.key_valid.extent(0) > 0 && mask.key_len.extent(0) == 0)
    return "a key-padding mask that is not a prefix of every sample's keys (cuDNN's padding masks take a length "
           "per sample)";
  if (mask.doc_start.extent(0) > 0) return "document starts (packed documents would need cuDNN's ragged layout)";
  return "";
}

namespace {

void check_call(const SdpaPlan& p, const Act& qkv, const Act& y, const FloatView& lse, const DropoutSpec& drop,
                const SdpaLengths& len) {
  TRIDENT_REQUIRE(p.error.empty(), "sdpa: " << p.error);
  const DType dt = p.bf16 ? DType::BF16 : DType::F16;
  TRIDENT_REQUIRE(qkv.dt == dt && y.dt == dt, "internal: sdpa: qkv and y must be " << dtype_name(dt));
  TRIDENT_REQUIRE(qkv.size() >= p.v.at(p.b - 1, p.h_kv - 1, p.s - 1, p.d - 1) + 1 &&
                      y.size() >= p.o.at(p.b - 1, p.h_q - 1, p.s - 1, p.d - 1) + 1 &&
                      static_cast<std::int64_t>(lse.extent(0)) >= p.b * p.h_q * p.s,
                  "internal: sdpa: buffers smaller than the plan");
  TRIDENT_REQUIRE(drop.p == p.dropout && !drop.mapped() && drop.heads == 0,
                  "internal: sdpa: the call's dropout is not the plan's");
  TRIDENT_REQUIRE(p.padded ? static_cast<std::int64_t>(len.q.extent(0)) >= p.b &&
                                 static_cast<std::int64_t>(len.kv.extent(0)) >= p.b
                           : len.kv.extent(0) == 0,
                  "internal: sdpa: the call's sequence lengths are not the plan's");
}

}  // namespace

#if !defined(TRIDENT_ENABLE_CUDA)
// ---- the host's stand-in -------------------------------------------------------------------------
namespace {

template <class F>
struct StandIn {
  const SdpaPlan& p;
  const DropoutSpec& drop;
  const std::int32_t* kv_len;  // (b) the valid keys of each sample, where padded
  std::int64_t rep() const { return p.h_q / p.h_kv; }
  // keys of sample b: [0, keys(b)); the last key query i attends to
  std::int64_t keys(std::int64_t b) const { return p.padded ? kv_len[b] : p.s; }
  std::int64_t last_key(std::int64_t b, std::int64_t i) const { return std::min(p.causal ? i : p.s - 1, keys(b) - 1); }
  // the dropout factor of probability (b, h, i, j): 0 or 1 / (1 - p)
  float keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (!drop.active()) return 1.f;
    const auto c = static_cast<std::uint64_t>(((b * p.h_q + h) * p.s + i) * p.s + j);
    return dropout_uniform(drop.key, c) >= drop.p ? 1.f / (1.f - drop.p) : 0.f;
  }
  template <class W>
  float dot(const W* a, std::int64_t ia, const W* b, std::int64_t ib) const {
    float acc = 0.f;
    for (std::int64_t c = 0; c < p.d; ++c) acc += F::load(a[ia + c]) * F::load(b[ib + c]);
    return acc;
  }
  float score(const std::uint16_t* qkv, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return p.scale * dot(qkv, p.q.at(b, h, i, 0), qkv, p.k.at(b, h / rep(), j, 0));
  }
};

template <class F>
void stand_in_forward(const SdpaPlan& p, const DropoutSpec& drop, const std::uint16_t* qkv, std::uint16_t* y,
                      float* lse, const std::int32_t* kv_len) {
  const StandIn<F> S{p, drop, kv_len};
  const std::int64_t rows = p.b * p.h_q * p.s;
#if defined(TRIDENT_HOST_OPENMP)
#pragma omp parallel for if (rows * p.s > 65536)
#endif
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t b = r / (p.h_q * p.s), h = (r / p.s) % p.h_q, i = r % p.s, g = h / S.rep();
    const std::int64_t last = S.last_key(b, i);
    std::vector<float> sc(static_cast<size_t>(last + 1)), o(static_cast<size_t>(p.d), 0.f);
    float m = -INFINITY;
    for (std::int64_t j = 0; j <= last; ++j) m = std::max(m, sc[static_cast<size_t>(j)] = S.score(qkv, b, h, i, j));
    float l = 0.f;
    for (float& e : sc) l += (e = std::exp(e - m));
    for (std::int64_t j = 0; j <= last; ++j) {
      const float w = sc[static_cast<size_t>(j)] / l * S.keep(b, h, i, j);
      if (w == 0.f) continue;
      const std::int64_t vj = p.v.at(b, g, j, 0);
      for (std::int64_t c = 0; c < p.d; ++c) o[static_cast<size_t>(c)] += w * F::load(qkv[vj + c]);
    }
    for (std::int64_t c = 0; c < p.d; ++c) y[p.o.at(b, h, i, c)] = F::store(o[static_cast<size_t>(c)]);
    lse[p.stats.at(b, h, i, 0)] = m + std::log(l);
  }
}

template <class F>
void stand_in_backward(const SdpaPlan& p, const DropoutSpec& drop, const std::uint16_t* qkv, const std::uint16_t* y,
                       const std::uint16_t* dy, const float* lse, std::uint16_t* dqkv, const std::int32_t* kv_len) {
  const StandIn<F> S{p, drop, kv_len};
  const std::int64_t rows = p.b * p.h_q * p.s, rep = S.rep();
  std::vector<float> D(static_cast<size_t>(rows));  // rowsum(dO o): the softmax backward's delta
  const auto at = [&](std::int64_t r, std::int64_t& b, std::int64_t& h, std::int64_t& i) {
    b = r / (p.h_q * p.s), h = (r / p.s) % p.h_q, i = r % p.s;
  };
  // dp_ij = dO_i v_j; ds_ij = p_ij (keep_ij dp_ij - D_i)
  const auto grad = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, float& pd) {
    const float pr = std::exp(S.score(qkv, b, h, i, j) - lse[p.stats.at(b, h, i, 0)]), z = S.keep(b, h, i, j);
    pd = pr * z;
    const float dp = S.dot(dy, p.o.at(b, h, i, 0), qkv, p.v.at(b, h / rep, j, 0));
    return pr * (z * dp - D[static_cast<size_t>((b * p.h_q + h) * p.s + i)]);
  };
  // D_i, then dq_i = scale sum_j ds_ij k_j, one query row per index
#if defined(TRIDENT_HOST_OPENMP)
#pragma omp parallel for if (rows * p.s > 65536)
#endif
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t b, h, i;
    at(r, b, h, i);
    D[static_cast<size_t>(r)] = S.dot(dy, p.o.at(b, h, i, 0), y, p.o.at(b, h, i, 0));
    std::vector<float> dq(static_cast<size_t>(p.d), 0.f);
    for (std::int64_t j = 0; j <= S.last_key(b, i); ++j) {
      float pd;
      const float ds = grad(b, h, i, j, pd) * p.scale;
      const std::int64_t kj = p.k.at(b, h / rep, j, 0);
      for (std::int64_t c = 0; c < p.d; ++c) dq[static_cast<size_t>(c)] += ds * F::load(qkv[kj + c]);
    }
    for (std::int64_t c = 0; c < p.d; ++c) dqkv[p.q.at(b, h, i, c)] = F::store(dq[static_cast<size_t>(c)]);
  }
  // dk_j = scale sum_(h in the group, i) ds_ij q_i, dv_j = sum pd_ij dO_i, one key row per index
  const std::int64_t krows = p.b * p.h_kv * p.s;
#if defined(TRIDENT_HOST_OPENMP)
#pragma omp parallel for if (krows * p.s > 65536)
#endif
  for (std::int64_t r = 0; r < krows; ++r) {
    const std::int64_t b = r / (p.h_kv * p.s), g = (r / p.s) % p.h_kv, j = r % p.s;
    std::vector<float> dk(static_cast<size_t>(p.d), 0.f), dv(static_cast<size_t>(p.d), 0.f);
    for (std::int64_t h = g * rep; h < (g + 1) * rep && j < S.keys(b); ++h)  // a padded key: zero
      for (std::int64_t i = p.causal ? j : 0; i < p.s; ++i) {
        float pd;
        const float ds = grad(b, h, i, j, pd) * p.scale;
        const std::int64_t qi = p.q.at(b, h, i, 0), oi = p.o.at(b, h, i, 0);
        for (std::int64_t c = 0; c < p.d; ++c) {
          dk[static_cast<size_t>(c)] += ds * F::load(qkv[qi + c]);
          dv[static_cast<size_t>(c)] += pd * F::load(dy[oi + c]);
        }
      }
    for (std::int64_t c = 0; c < p.d; ++c) {
      dqkv[p.k.at(b, g, j, c)] = F::store(dk[static_cast<size_t>(c)]);
      dqkv[p.v.at(b, g, j, c)] = F::store(dv[static_cast<size_t>(c)]);
    }
  }
}

}  // namespace

std::string sdpa_unavailable() {
  if constexpr (!kDeviceOnHost) return "a host build, where the cudnn entry does not run";
  return "";
}

void sdpa_forward(const SdpaPlan& p, const Act& qkv, const Act& y, const FloatView& lse, const DropoutSpec& drop,
                  const SdpaLengths& len) {
  check_call(p, qkv, y, lse, drop, len);
  const GemmRegion region("ops::sdpa_forward");
  if (p.bf16)
    stand_in_forward<Bf16Fmt>(p, drop, qkv.h.data(), y.h.data(), lse.data(), len.kv.data());
  else
    stand_in_forward<Fp16Fmt>(p, drop, qkv.h.data(), y.h.data(), lse.data(), len.kv.data());
}

void sdpa_backward(const SdpaPlan& p, const Act& qkv, const Act& y, const HalfView& dy16, const FloatView& lse,
                   const HalfView& dqkv16, const DropoutSpec& drop, const SdpaLengths& len) {
  check_call(p, qkv, y, lse, drop, len);
  TRIDENT_REQUIRE(dy16.extent(0) >= static_cast<size_t>(y.size()) &&
                      dqkv16.extent(0) >= static_cast<size_t>(qkv.size()),
                  "internal: sdpa: gradient buffers smaller than the plan");
  const GemmRegion region("ops::sdpa_backward");
  if (p.bf16)
    stand_in_backward<Bf16Fmt>(p, drop, qkv.h.data(), y.h.data(), dy16.data(), lse.data(), dqkv16.data(),
                               len.kv.data());
  else
    stand_in_backward<Fp16Fmt>(p, drop, qkv.h.data(), y.h.data(), dy16.data(), lse.data(), dqkv16.data(),
                               len.kv.data());
}
#else
// ---- CUDA: cuDNN (ops/sdpa_cudnn_cuda.cpp) ----------------------------------------------------------
namespace {
#if defined(TRIDENT_HAVE_CUDNN)
void* stream() { return static_cast<void*>(Kokkos::Cuda().cuda_stream()); }
// the call's Philox seed and offset where cuDNN reads them, written by one small kernel on the
// stream when the call drops (no host wait)
const std::int64_t* rng_state(const DropoutSpec& drop) {
  static Kokkos::View<std::int64_t*, MemSpace> rng("ops::sdpa_rng", 2);
  if (drop.active()) {
    const auto r = rng;
    const auto seed = static_cast<std::int64_t>(drop.key >> 1);
    Kokkos::parallel_for(
        "ops::sdpa_rng", range(1), KOKKOS_LAMBDA(std::int64_t) {
          r(0) = seed;
          r(1) = 0;
        });
  }
  return rng.data();
}
#endif
}  // namespace

std::string sdpa_unavailable() {
#if defined(TRIDENT_HAVE_CUDNN)
  static const std::string why = cudnn_sdpa::unavailable();
  return why;
#else
  return "this CUDA build has no cuDNN frontend (configure with -DTRIDENT_CUDNN_FRONTEND=DIR, as scripts/gpu_kit.sh does)";
#endif
}

void sdpa_forward(const SdpaPlan& p, const Act& qkv, const Act& y, const FloatView& lse, const DropoutSpec& drop,
                  const SdpaLengths& len) {
  check_call(p, qkv, y, lse, drop, len);
#if defined(TRIDENT_HAVE_CUDNN)
  const std::int64_t* rng = rng_state(drop);
  const GemmRegion region("ops::sdpa_forward");
  cudnn_sdpa::forward(p, stream(), qkv.h.data(), y.h.data(), lse.data(), rng, len.q.data(), len.kv.data());
#else
  TRIDENT_REQUIRE(false, "sdpa: " << sdpa_unavailable());
#endif
}

void sdpa_backward(const SdpaPlan& p, const Act& qkv, const Act& y, const HalfView& dy16, const FloatView& lse,
                   const HalfView& dqkv16, const DropoutSpec& drop, const SdpaLengths& len) {
  check_call(p, qkv, y, lse, drop, len);
#if defined(TRIDENT_HAVE_CUDNN)
  const std::int64_t* rng = rng_state(drop);
  // the padded keys' dk and dv are zero: set here, not left to what cuDNN writes past a length
  if (p.padded) Kokkos::deep_copy(ExecSpace(), dqkv16, std::uint16_t{0});
  const GemmRegion region("ops::sdpa_backward");
  cudnn_sdpa::backward(p, stream(), qkv.h.data(), y.h.data(), dy16.data(), lse.data(), dqkv16.data(), rng, len.q.data(),
                       len.kv.data());
#else
  (void)dy16;
  (void)dqkv16;
  TRIDENT_REQUIRE(false, "sdpa: " << sdpa_unavailable());
#endif
}
#endif

}  // namespace trident
