// Core tensor types. Every tensor is a Kokkos::View in the default execution space's memory,
// laid out row-major (LayoutRight, stated explicitly: a CUDA Kokkos defaults to LayoutLeft).
// Activations are flat 1-D views; their logical shape is written beside them as // (B, T, C).
#pragma once
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>

namespace trident {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;

template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
template <class T>
using HostView1 = Kokkos::View<T*, Kokkos::LayoutRight, HostSpace>;

using FloatView = View1<float>;
using IntView = View1<int32_t>;
using HostFloatView = HostView1<float>;
using HostIntView = HostView1<int32_t>;

// 16-bit floating point values are stored as raw words (Kokkos' half types are 4 bytes on
// host builds).
using bf16_bits = std::uint16_t;

inline Kokkos::RangePolicy<ExecSpace> range(std::int64_t n) {
  return Kokkos::RangePolicy<ExecSpace>(0, n);
}

// Zero-initialised device views with a label (Kokkos 3.4 wants size_t extents).
inline FloatView make_float(const char* label, std::int64_t n) { return FloatView(std::string(label), static_cast<size_t>(n)); }
inline IntView make_int(const char* label, std::int64_t n) { return IntView(std::string(label), static_cast<size_t>(n)); }

// Device subview [offset, offset + n) of a flat buffer.
template <class V>
inline V slice(const V& v, std::int64_t offset, std::int64_t n) {
  return Kokkos::subview(v, Kokkos::make_pair(offset, offset + n));
}

}  // namespace trident
