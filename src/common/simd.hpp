// Vectorisation hints for reductions inside host kernels ("omp simd", honoured with
// -fopenmp-simd, no OpenMP runtime needed); empty on device backends.
#pragma once
#include <Kokkos_Core.hpp>

// TRIDENT_HOST_NOINLINE: a host reduction helper compiled once, whatever calls it (GCC vectorises
// an inlined "omp simd" reduction differently, and 4x slower, inside the host threads' loops).
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
#define TRIDENT_HOST_NOINLINE
#define TRIDENT_SIMD
#define TRIDENT_SIMD_SUM(var)
#define TRIDENT_SIMD_MAX(var)
#else
#define TRIDENT_HOST_NOINLINE __attribute__((noinline))
#define TRIDENT_SIMD _Pragma("omp simd")
#define TRIDENT_PRAGMA(x) _Pragma(#x)
#define TRIDENT_SIMD_SUM(var) TRIDENT_PRAGMA(omp simd reduction(+ : var))
#define TRIDENT_SIMD_MAX(var) TRIDENT_PRAGMA(omp simd reduction(max : var))
#endif
