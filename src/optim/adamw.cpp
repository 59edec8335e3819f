// AdamW kernel: one thread per chunk of 4096 elements (common/host_parallel: Kokkos, or this
// rank's OpenMP threads under a Serial host Kokkos) with a vectorisable inner loop
// that scales the gradient, applies the decoupled decay (only below decay_size), updates both
// moments and the parameter; in mixed precision the updated fp32 masters are also rounded into
// the 16-bit model words; on request it also zeroes the gradients it consumed. Also init_master
// and grad_norm_squared (ops/elementwise's sum_squares).
#include "optim/adamw.hpp"

#include <cmath>

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/host_parallel.hpp"
#include "common/simd.hpp"
#include "ops/elementwise.hpp"
#include "ops/mixed_precision.hpp"

namespace trident {

AdamW::AdamW(const AdamWConfig& cfg, std::int64_t n, std::int64_t decay_size, std::int64_t begin)
    : AdamW(cfg, std::vector<Segment>{Segment{begin, n, decay_size, false, 0}}) {}

AdamW::AdamW(const AdamWConfig& cfg, std::vector<Segment> segments) : cfg_(cfg), seg_(std::move(segments)) {
  for (Segment& s : seg_) {
    s.at = n_;
    n_ += s.n;
  }
  m_ = make_float("adamw::exp_avg", n_);
  v_ = make_float("adamw::exp_avg_sq", n_);
}

namespace detail {
// Where updated parameters go besides the fp32 buffer: nowhere (fp32 model), or rounded into
// the 16-bit model.
struct NoCopy {
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t, float) const {}
};
template <class F>
struct HalfCopy {
  std::uint16_t* out;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, float v) const { out[i] = F::store(v); }
};

template <bool ZeroGrads, class Out>
void adamw_kernel(float* p, float* g, float* m, float* v, Out out, std::int64_t n, std::int64_t nd, float b1, float b2,
                  float eps, float step_size, float sqrt_bc2, float decay, float grad_scale) {
  // One thread per chunk of kChunk elements; the inner loop is branch-free and vectorised (the
  // square root needs -fno-math-errno), bound by memory traffic: 7 floats per parameter (8 when
  // it also zeroes the gradient it read: one store more, instead of a separate zeroing pass that
  // reads and writes the buffer again). The file is compiled with -ffp-contract=off (nvcc:
  // --fmad=false), so the fused multiply-adds are the dfma calls and nothing else: the scalar
  // and the vector loop give the same bits (src/CMakeLists.txt).
  // On a device one element per thread (adjacent threads on adjacent elements: coalesced), with
  // the same arithmetic per element.
  constexpr std::int64_t kChunk = kDeviceKernels ? 1 : 4096;
  for_each_chunk(
      "optim::adamw_step", (n + kChunk - 1) / kChunk, KOKKOS_LAMBDA(std::int64_t c) {
        const std::int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
        TRIDENT_SIMD
        for (std::int64_t i = b; i < e; ++i) {
          const float gi = g[i] * grad_scale;
          const float pi = p[i] * (i < nd ? decay : 1.f);
          const float mi = dfma(b1, m[i], (1.f - b1) * gi);
          const float vi = dfma(b2, v[i], (1.f - b2) * gi * gi);
          m[i] = mi;
          v[i] = vi;
          const float np = pi - step_size * mi / (dsqrt(vi) / sqrt_bc2 + eps);
          p[i] = np;
          out(i, np);
          if constexpr (ZeroGrads) g[i] = 0.f;
        }
      });
}
}  // namespace detail

template <class Out>
void AdamW::update(const Segment& s, float* p, float* g, Out out, double lr, float grad_scale, GradsAfter after) {
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(step_)));
  const float sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(cfg_.beta2, static_cast<double>(step_))));
  const float step_size = static_cast<float>(lr) / bc1;
  const float decay = static_cast<float>(1.0 - lr * cfg_.weight_decay);
  // weight decay on the segment's flat prefix below decay_end: local indices below nd
  const std::int64_t nd = s.decay_end - s.begin;
  float* m = m_.data() + s.at;
  float* v = v_.data() + s.at;
  if (after == GradsAfter::zero)
    detail::adamw_kernel<true>(p, g, m, v, out, s.n, nd, b1, b2, eps, step_size, sqrt_bc2, decay, grad_scale);
  else
    detail::adamw_kernel<false>(p, g, m, v, out, s.n, nd, b1, b2, eps, step_size, sqrt_bc2, decay, grad_scale);
}

void AdamW::step(const FloatView& params, const FloatView& grads, double lr, float grad_scale, GradsAfter after) {
  ++step_;
  for (const Segment& s : seg_)
    update(s, params.data() + s.begin, grads.data() + s.begin, detail::NoCopy{}, lr, grad_scale, after);
}

void AdamW::init_master(DType dt, const HalfView& model16) {
  dt_ = dt;
  master_ = make_float("adamw::master", n_);
  for (const Segment& s : seg_) unpack_half(dt, slice(master_, s.at, s.n), slice(model16, s.begin, s.n), s.n);
  TRIDENT_DEVICE_WAIT();
}

void AdamW::step_mixed(const HalfView& model16, const FloatView& grads, double lr, float grad_scale, GradsAfter after) {
  ++step_;
  for (const Segment& s : seg_) {
    std::uint16_t* out = model16.data() + s.begin;
    float* master = master_.data() + s.at;
    if (dt_ == DType::BF16)
      update(s, master, grads.data() + s.begin, detail::HalfCopy<Bf16Fmt>{out}, lr, grad_scale, after);
    else
      update(s, master, grads.data() + s.begin, detail::HalfCopy<Fp16Fmt>{out}, lr, grad_scale, after);
  }
}

bool AdamW::fuses_multiply_add() { return dfma_fuses(); }

double grad_norm_squared(const FloatView& grads, std::int64_t n) { return sum_squares(grads, n); }

}  // namespace trident
