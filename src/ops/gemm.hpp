// GEMM: the ONLY place a BLAS (oneDNN or CBLAS on the host, cuBLAS on CUDA) is called.
// Row-major convention throughout: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// lda/ldb/ldc are row strides of the stored (untransposed) matrices. Pointers are device
// pointers of the default memory space (host memory on host builds).
#pragma once
#include <cstdint>
#include <vector>

#include "common/half.hpp"

namespace trident {

enum class Trans { N, T };

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// `batch` independent GEMMs; matrix b of A starts at A + b * strideA (likewise B, C).
void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B, std::int64_t ldb,
                          std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                          std::int64_t batch);

// Mixed precision: A and B are bf16 words (common/half.hpp), the products are accumulated in
// fp32 and C is fp32 (Megatron's bf16 GEMMs with fp32 accumulation; with beta = 1 they
// accumulate straight into an fp32 main gradient). Host: oneDNN's bf16 matmul where this CPU has
// one (oneDNN 2.6: AVX-512 and up; AVX512-BF16 or AMX kernels where present); elsewhere (AVX2
// CPUs, ONEDNN_MAX_CPU_ISA=AVX2, CBLAS builds) the operands are widened to fp32 and multiplied by
// the fp32 GEMM, the same products (exact in fp32) with fp32 accumulation (gemm_bf16_widened).
// CUDA: cublasGemmEx with CUDA_R_16BF inputs, fp32 compute.
void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// `batch` bf16 GEMMs at strides, as gemm_strided_batched (attention's per-head products). Host
// (oneDNN, OpenMP): the batch shared by the rank's threads, each product whole on one thread, so
// it has the bits gemm_bf16 gives it on one thread, whatever the thread count (unit
// Gemm.Bf16BatchedGivesTheBitsOfOneThreadProducts). CUDA: one cublasGemmStridedBatchedEx call.
void gemm_bf16_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const std::uint16_t* A, std::int64_t lda, std::int64_t strideA, const std::uint16_t* B,
                               std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                               std::int64_t strideC, std::int64_t batch);

#if !defined(TRIDENT_ENABLE_CUDA)
// Host: whether gemm_bf16 uses oneDNN's bf16 matmul on this CPU (false: it widens). The apps'
// banner says which (gemm_backend_name).
bool gemm_bf16_native();
// Host: gemm_bf16's widened path, whatever the CPU: gemm() on the operands widened to fp32 (exact).
// The smaller operand is widened whole; the larger (op(B) when N >= M, else op(A)), once it exceeds
// 4 Mi values, in chunks of floor(4 Mi / K / 16) * 16 of its columns (op(B)) or rows (op(A)), each
// chunk's part of C computed by gemm() before the next is widened.
void gemm_bf16_widened(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                       const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta,
                       float* C, std::int64_t ldc);
#endif

// The same with fp16 words (IEEE binary16). Host: widened to fp32 (exact) and sgemm, since
// oneDNN's fp16 matmul needs AVX512-FP16; CUDA: cublasGemmEx with CUDA_R_16F inputs.
void gemm_fp16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// A GEMM operand of a run-time type: fp32, bf16 or fp16 values in device memory.
struct GemmOperand {
  DType dt = DType::F32;
  const void* p = nullptr;
  // the operand `elements` values further on
  GemmOperand at(std::int64_t elements) const { return {dt, static_cast<const char*>(p) + elements * dtype_bytes(dt)}; }
};
inline GemmOperand operand(const float* p) { return {DType::F32, p}; }
inline GemmOperand operand(DType dt, const std::uint16_t* p) { return {dt, p}; }
inline GemmOperand operand(const Act& a) {
  return a.is_half() ? GemmOperand{a.dt, a.h.data()} : GemmOperand{DType::F32, a.f.data()};
}

// C (fp32) = alpha op(A) op(B) + beta C with A and B of one type (fp32: gemm; bf16: gemm_bf16;
// fp16: gemm_fp16). Mixed operand types are an error.
void gemm_mixed(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, GemmOperand A,
                std::int64_t lda, GemmOperand B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);
void gemm_mixed_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                                GemmOperand A, std::int64_t lda, std::int64_t strideA, GemmOperand B, std::int64_t ldb,
                                std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                                std::int64_t batch);

// A batch of equally shaped GEMMs over nested levels, outermost first: product (i0, i1, ...) reads
// A at sum_l i_l * levels[l].a elements from the base (B likewise with .b) and writes C at
// sum_l i_l * levels[l].c. A level's stride may be 0 for an input read by all its products (the
// key and value heads a group of query heads shares); no two products may write the same C.
struct GemmBatchLevel {
  std::int64_t count = 1;
  std::int64_t a = 0, b = 0, c = 0;
};
struct GemmBatch {
  std::vector<GemmBatchLevel> levels;  // outermost first; none: one product
  std::int64_t products() const;
  // the element offsets of product p (the levels' indices in row-major order)
  void offsets(std::int64_t p, std::int64_t& a, std::int64_t& b, std::int64_t& c) const;
  // The same products in the same order with the fewest levels: levels of count 1 dropped, and a
  // level folded into the next inner one where each of its strides is the inner level's stride
  // times the inner count. One level left: one strided-batched library call.
  GemmBatch merged() const;
  // Error naming the first two products that write the same C.
  void check_outputs() const;
};
// The whole batch in one call of the GEMM interface (one GemmRegion). CUDA (gemm_cuda.cpp): one
// library call, strided-batched where the levels merge into one (merged()), otherwise batched over
// pointer arrays built on the device once per distinct batch and kept. Host: the levels but the
// innermost looped, the innermost one gemm_mixed_strided_batched, so each product has the bits that
// call gives it.
void gemm_mixed_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, GemmOperand A,
                        std::int64_t lda, GemmOperand B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
                        const GemmBatch& batch);

// One GEMM of a group (gemm_mixed_grouped): C (M, N) = alpha op(A) op(B) + beta C.
struct GemmGroup {
  std::int64_t M = 0, N = 0, K = 0;
  GemmOperand A;
  std::int64_t lda = 0;
  GemmOperand B;
  std::int64_t ldb = 0;
  float* C = nullptr;
  std::int64_t ldc = 0;
};
// Independent GEMMs of different shapes with one transposition, alpha and beta (the experts of a
// mixture-of-experts layer: one per expert, its tokens' rows). A group of M = 0 or N = 0 does
// nothing; one of K = 0 scales C by beta.
// - Host (gemm.cpp): the groups are shared out over the rank's threads, each GEMM whole on one
//   thread (fp32, bf16; as the batched GEMMs share their batch), unless (fp32) one group large
//   enough for gemm()'s own split would leave the threads unbalanced; then, and for fp16, one GEMM
//   after another, each threaded as gemm_mixed threads it. Each group has the bits of gemm_mixed on its
//   operands at one thread (unit GemmGrouped.*).
// - CUDA (gemm_cuda.cpp): one cuBLAS grouped call for all groups (cublasSgemmGroupedBatched;
//   cublasGemmGroupedBatchedEx with 16-bit A, B and fp32 C), or one cublasGemmEx per group where
//   cuBLAS refuses the types; the grouped kernels' summation order may differ from the single
//   GEMMs', so its results equal gemm_mixed's to rounding, not to the bit.
void gemm_mixed_grouped(Trans ta, Trans tb, float alpha, float beta, const std::vector<GemmGroup>& groups);
// C = beta C over a group's M x N (its K = 0 case; on the device, fenced): gemm_mixed_grouped's helper.
void gemm_grouped_scale(float beta, const GemmGroup& g);

// fp32 GEMMs on TF32 tensor cores (cuBLAS's CUBLAS_TF32_TENSOR_OP_MATH; deck precision.tf32).
// Host builds: ignored (no TF32 on CPUs), fp32 stays fp32.
void gemm_set_tf32(bool on);

// Name of the library behind gemm(), for logs.
const char* gemm_backend_name();

}  // namespace trident
