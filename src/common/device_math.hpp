// Math usable in kernels on every backend: the C library's float functions, which nvcc also
// provides as device functions (Kokkos::exp etc. only exist from Kokkos 4).
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
}  // namespace trident
