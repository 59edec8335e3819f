// GEMMs with a fused epilogue and an output in 16 bits or fp32: the device path's linear layers
// (docs/DESIGN.md "Kernels on a GPU"). CUDA: one cuBLASLt call (gemm_lt_cuda.cpp, the only place
// cuBLASLt is called), its algorithm chosen by cuBLASLt's heuristic once per call shape and kept,
// with a 32 MiB workspace. Host builds: the same arithmetic (gemm_lt.cpp: gemm_mixed into fp32,
// then the epilogue in the same call on this rank's threads), so that a
// TRIDENT_DEVICE_KERNELS_ON_HOST build runs and counts the device path as a GPU would.
//
// Row-major as ops/gemm.hpp: Z (M, N) = alpha op(A) op(B), fp32 accumulation, then
//   None          C = Z
//   Bias          C = Z + bias[j]
//   GeluAuxBias   aux = Z + bias[j], C = gelu(Z + bias[j]) (the tanh form; gelu of the fp32 value,
//                 aux rounded to C's type: the pre-activation the GELU's backward reads)
// each stored in C's type (rounding to nearest even for 16 bits). A and B have one type; the bias
// has C's type (or fp32). No beta: C is overwritten.
#pragma once
#include <cstdint>
#include <string>

#include "ops/gemm.hpp"

namespace trident {

enum class Epilogue { None, Bias, GeluAuxBias };
const char* epilogue_name(Epilogue e);

struct GemmLt {
  Trans ta = Trans::N, tb = Trans::N;
  std::int64_t M = 0, N = 0, K = 0;
  float alpha = 1.f;
  GemmOperand A;
  std::int64_t lda = 0;
  GemmOperand B;
  std::int64_t ldb = 0;
  DType out_dt = DType::F32;  // C's (and aux's) type
  void* C = nullptr;
  std::int64_t ldc = 0;
  Epilogue epilogue = Epilogue::None;
  const void* bias = nullptr;  // Bias, GeluAuxBias: N values
  DType bias_dt = DType::F32;
  void* aux = nullptr;  // GeluAuxBias: (M, N) values of out_dt at row stride ldaux
  std::int64_t ldaux = 0;
};

// A call without epilogue, alpha 1: C (M, N) of type out_dt = op(A) op(B); set epilogue, bias and
// aux after it for the others.
inline GemmLt lt_call(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, GemmOperand A,
                      std::int64_t lda, GemmOperand B, std::int64_t ldb, DType out_dt, void* C, std::int64_t ldc) {
  return GemmLt{ta, tb, M, N, K, 1.f, A, lda, B, ldb, out_dt, C, ldc};  // the rest as declared
}

// cuBLASLt's column-major view of a GemmLt (the row-major C is the column-major C^T = op(B)^T
// op(A)^T: the operands swap, as gemm_cuda.cpp's cuBLAS calls do), as data: what the CUDA build
// passes to cuBLASLt, built and checked on every backend (unit Gemm.LtPlan*).
struct LtPlan {
  std::string error;                      // not empty: the call cannot be made (it says why)
  bool trans_a = false, trans_b = false;  // CUBLAS_OP_T for cuBLASLt's A (the row-major B) and B
  std::int64_t m = 0, n = 0, k = 0;       // D (m, n) column-major = C^T
  // the stored matrices' column-major rows, columns and leading dimensions
  std::int64_t a_rows = 0, a_cols = 0, lda = 0, b_rows = 0, b_cols = 0, ldb = 0, ldd = 0;
  const void* a = nullptr;  // the row-major B
  const void* b = nullptr;  // the row-major A
  DType ab_dt = DType::F32, d_dt = DType::F32;
  Epilogue epilogue = Epilogue::None;
  std::int64_t bias_length = 0;  // m: one bias value per row of D, that is per column of C
  std::int64_t aux_ld = 0;
};
LtPlan lt_plan(const GemmLt& g);

// The call; throws naming the problem where lt_plan refuses it.
void gemm_lt(const GemmLt& g);

}  // namespace trident
