// Math usable in kernels on every backend: the C library's float functions, which nvcc also
// provides as device functions (Kokkos::exp etc. only exist from Kokkos 4), and fast_exp /
// fast_tanh, branch-free approximations (no libm call) that compilers vectorise.
#pragma once
#include <Kokkos_Core.hpp>
#include <math.h>

namespace trident {
KOKKOS_INLINE_FUNCTION float dexp(float x) { return expf(x); }
KOKKOS_INLINE_FUNCTION float dlog(float x) { return logf(x); }
KOKKOS_INLINE_FUNCTION float dtanh(float x) { return tanhf(x); }
KOKKOS_INLINE_FUNCTION float dsqrt(float x) { return sqrtf(x); }
KOKKOS_INLINE_FUNCTION float dmax(float a, float b) { return a > b ? a : b; }
KOKKOS_INLINE_FUNCTION double dsqrt(double x) { return sqrt(x); }
// a * b + c rounded once where the target has a fused multiply-add (every CUDA device; a host
// compiled with FMA, e.g. -march=native on x86-64), else rounded twice, as the compiler's own
// contraction did before. Kernels that must give the same bits whether the compiler vectorises
// them or not (AdamW, compiled with -ffp-contract=off) spell their fused operations with it.
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define TRIDENT_HOST_FMA 1  // the host code is compiled for a CPU with fused multiply-add
#endif
KOKKOS_INLINE_FUNCTION float dfma(float a, float b, float c) {
#if defined(__CUDA_ARCH__) || defined(TRIDENT_HOST_FMA)
  return fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
// a * b rounded on its own even where the compiler contracts a following add into a fused
// multiply-add: written as fma(a, b, -0) (exact product plus -0: the rounded product, zeros'
// signs kept), whose result the compiler does not fuse again. Without FMA it cannot contract.
KOKKOS_INLINE_FUNCTION float dmul(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(TRIDENT_HOST_FMA)
  return fmaf(a, b, -0.f);
#else
  return a * b;
#endif
}
// Whether dfma rounds once where this build's kernels run (on the device in a CUDA build, else on
// this host): what tests of kernels spelled with dfma compute their expected bits with. Defined in
// device_math.cpp, compiled with the library's flags (a test's own flags may lack FMA).
bool dfma_fuses();
}  // namespace trident

namespace trident {

// exp for softmax-style arguments, written so that compilers vectorise it (branch-free, no
// libm call) and identical on host and device: x = k ln2 + r with |r| <= ln2/2, exp(r) by its
// degree-6 Taylor polynomial (truncation < 1.5e-7 relative, about 1 ulp), 2^k put into the
// exponent bits. Arguments are clamped to [-87, 88] (exp(-87) ~ 1.6e-38 stands in for 0).
KOKKOS_INLINE_FUNCTION float fast_exp(float x) {
  x = x > 88.f ? 88.f : x;
  x = x < -87.f ? -87.f : x;
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
  // k = round(x log2 e) via truncation of a positive number (floorf does not vectorise)
  const int k = static_cast<int>(x * kLog2e + 128.5f) - 128;
  const float kf = static_cast<float>(k);
  const float r = (x - kf * kLn2Hi) - kf * kLn2Lo;
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int bits = (k + 127) << 23;
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(bits);
#else
  const float scale = __builtin_bit_cast(float, bits);  // vectorises (GCC >= 11, Clang)
#endif
  return p * scale;
}

// tanh through fast_exp: 1 - 2 / (exp(2u) + 1); absolute error ~1e-7, vectorisable.
KOKKOS_INLINE_FUNCTION float fast_tanh(float u) { return 1.f - 2.f / (fast_exp(2.f * u) + 1.f); }

}  // namespace trident
