// Building a Kokkos older than 4.7 against CUDA 13: force-included (nvcc -include) into the
// Kokkos build and into every Trident source compiled against that Kokkos, by scripts/gpu_kit.sh
// and scripts/gpu_check.sh only. CUDA 13 removed two runtime-API signatures that those Kokkos
// versions call; these C++ overloads restore them on top of their CUDA 13 replacements. Not
// needed (and not used) with Kokkos 4.7 or later, or with CUDA 12.
#pragma once
#if defined(__cplusplus) && defined(__CUDACC__)
#include <cuda_runtime_api.h>
#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
// CUDA 13: cudaGraphAddDependencies takes per-edge data (nullptr: default edges).
inline cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const cudaGraphNode_t* from,
                                            const cudaGraphNode_t* to, size_t count) {
  return cudaGraphAddDependencies(graph, from, to, static_cast<const cudaGraphEdgeData*>(nullptr), count);
}
// CUDA 13: cudaMemPrefetchAsync takes a cudaMemLocation and flags instead of a device number.
inline cudaError_t cudaMemPrefetchAsync(const void* ptr, size_t count, int device, cudaStream_t stream) {
  cudaMemLocation where{};
  where.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  where.id = device == cudaCpuDeviceId ? 0 : device;
  return cudaMemPrefetchAsync(ptr, count, where, 0u, stream);
}
#endif
#endif
