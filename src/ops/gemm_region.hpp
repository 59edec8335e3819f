// The Kokkos Tools region around one GEMM call, on every backend (gemm.cpp, gemm_cuda.cpp), so
// that a tool such as perf's kernel timer sees the GEMMs next to the kernels. The region is named
// after the entry point ("ops::gemm", "ops::gemm_bf16", ...). With TRIDENT_GEMM_REGION_SHAPES=1 in
// the environment the name also carries the call's shape,
//     "ops::gemm_bf16 NT M=256 N=2304 K=768 batch=1 beta=0"
// (transposes of A and B, the product's dimensions, the batch, and beta), so that time can be
// told apart per GEMM of the step (perf/bench_mixed.py's per-shape table sets it). Without a tool
// loaded nothing is pushed and no name is formatted.
//
// One region is one call of the GEMM interface (ops/gemm.hpp), which a CUDA build makes as one
// library call (a strided-batched or grouped cuBLAS call for a batch), so that the regions count
// the device path's library calls (perf/step_profile.py). A region opened while another is open on
// the thread (a host batch's products, one by one) is not pushed.
#pragma once
#include <cstdint>

#include "ops/gemm.hpp"

namespace trident {

// The region name of gemm_mixed_batched for operands of type dt.
const char* gemm_batched_region(DType dt);

class GemmRegion {
 public:
  explicit GemmRegion(const char* base);
  GemmRegion(const char* base, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float beta,
             std::int64_t batch = 1);
  ~GemmRegion();
  GemmRegion(const GemmRegion&) = delete;
  GemmRegion& operator=(const GemmRegion&) = delete;

 private:
  bool pushed_ = false;
  static thread_local int open_;  // regions pushed on this thread and not yet popped
};

}  // namespace trident
