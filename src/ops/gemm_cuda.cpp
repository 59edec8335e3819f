// Device GEMM through cuBLAS (CUDA builds only; src/CMakeLists.txt drops *_cuda.cpp otherwise).
// Row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T by swapping
// the operands, so no transposes are materialised. One handle per process, bound to the
// Kokkos CUDA stream.
#include <cublas_v2.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <sstream>
#include <vector>

#include "common/error.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_cublas_status.hpp"
#include "ops/gemm_region.hpp"

#define TRIDENT_CUBLAS(call) TRIDENT_CUBLAS_STATUS("cuBLAS", call)

namespace trident {

namespace {
cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t created;
    TRIDENT_CUBLAS(cublasCreate(&created));
    TRIDENT_CUBLAS(cublasSetStream(created, Kokkos::Cuda().cuda_stream()));
    return created;
  }();
  return h;
}
cublasOperation_t op(Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; }
// Each cuBLAS call sits in a GemmRegion (ops/gemm_region.hpp), named as the host GEMMs' regions
// are, so that perf's kernel timer sees the GEMMs (their time under CUDA_LAUNCH_BLOCKING=1).
}  // namespace

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  const GemmRegion region("ops::gemm", ta, tb, M, N, K, beta);
  TRIDENT_CUBLAS(cublasSgemm(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                             &alpha, B, static_cast<int>(ldb), A, static_cast<int>(lda), &beta, C,
                             static_cast<int>(ldc)));
}

void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B, std::int64_t ldb,
                          std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                          std::int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const GemmRegion region("ops::gemm_batched", ta, tb, M, N, K, beta, batch);
  TRIDENT_CUBLAS(cublasSgemmStridedBatched(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M),
                                           static_cast<int>(K), &alpha, B, static_cast<int>(ldb), strideB, A,
                                           static_cast<int>(lda), strideA, &beta, C, static_cast<int>(ldc), strideC,
                                           static_cast<int>(batch)));
}

namespace {
// 16-bit words (CUDA_R_16BF or CUDA_R_16F bit for bit) with products accumulated in fp32
void gemm_16bit(cudaDataType type, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta,
                float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  const GemmRegion region(type == CUDA_R_16BF ? "ops::gemm_bf16" : "ops::gemm_fp16", ta, tb, M, N, K, beta);
  TRIDENT_CUBLAS(cublasGemmEx(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                              &alpha, B, type, static_cast<int>(ldb), A, type, static_cast<int>(lda), &beta, C,
                              CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
// `batch` such products at strides, in one cuBLAS call
void gemm_16bit_strided_batched(cudaDataType type, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                                float alpha, const std::uint16_t* A, std::int64_t lda, std::int64_t strideA,
                                const std::uint16_t* B, std::int64_t ldb, std::int64_t strideB, float beta, float* C,
                                std::int64_t ldc, std::int64_t strideC, std::int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const GemmRegion region(type == CUDA_R_16BF ? "ops::gemm_bf16_batched" : "ops::gemm_fp16_batched", ta, tb, M, N, K,
                          beta, batch);
  TRIDENT_CUBLAS(cublasGemmStridedBatchedEx(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M),
                                            static_cast<int>(K), &alpha, B, type, static_cast<int>(ldb), strideB, A,
                                            type, static_cast<int>(lda), strideA, &beta, C, CUDA_R_32F,
                                            static_cast<int>(ldc), strideC, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  gemm_16bit(CUDA_R_16BF, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const std::uint16_t* A, std::int64_t lda, std::int64_t strideA, const std::uint16_t* B,
                               std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                               std::int64_t strideC, std::int64_t batch) {
  // one call for the batch: a call per product cost about 5 us of launch each, 18 thousand calls per
  // step for GPT-2 124M's unfused attention at micro-batch 16 (perf/results/gpu_check_2026-12-04.md)
  gemm_16bit_strided_batched(CUDA_R_16BF, ta, tb, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,
                             strideC, batch);
}

void gemm_fp16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  gemm_16bit(CUDA_R_16F, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {
cudaDataType cuda_type(DType dt) {
  return dt == DType::F32 ? CUDA_R_32F : dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

using PointerView = Kokkos::View<std::uintptr_t*, Kokkos::LayoutRight, Kokkos::CudaSpace>;

// The pointer arrays of a batch cuBLAS cannot stride in one level: [B | A | C] (the operands
// swapped as in gemm()), one entry per product, computed on the device by one kernel the first
// time a batch (its base pointers, element size and levels) is seen, and kept: the step's buffers
// are allocated once, so from the second micro-batch on a batched call costs no kernel and no
// copy. Bounded: past 4096 distinct batches the kept arrays are dropped (freeing device memory
// waits for the device) and built again as met.
const PointerView& batch_pointers(const void* A, const void* B, const float* C, std::int64_t bytes,
                                  const GemmBatch& batch) {
  static std::map<std::vector<std::int64_t>, PointerView> kept;
  std::vector<std::int64_t> key{reinterpret_cast<std::int64_t>(A), reinterpret_cast<std::int64_t>(B),
                                reinterpret_cast<std::int64_t>(C), bytes};
  for (const GemmBatchLevel& l : batch.levels) key.insert(key.end(), {l.count, l.a, l.b, l.c});
  if (auto it = kept.find(key); it != kept.end()) return it->second;
  batch.check_outputs();
  if (kept.size() >= 4096) kept.clear();
  const std::int64_t n = batch.products();
  PointerView v("ops::gemm_batch_pointers", 3 * n);
  constexpr int kLevels = 4;
  if (batch.levels.size() > kLevels) throw Error::one("internal: gemm_mixed_batched: more than 4 batch levels");
  std::int64_t count[kLevels], sa[kLevels], sb[kLevels], sc[kLevels];
  const int nl = static_cast<int>(batch.levels.size());
  for (int l = 0; l < kLevels; ++l) {
    const GemmBatchLevel lv = l < nl ? batch.levels[static_cast<std::size_t>(l)] : GemmBatchLevel{};
    count[l] = lv.count;
    sa[l] = lv.a;
    sb[l] = lv.b;
    sc[l] = lv.c;
  }
  const auto a0 = reinterpret_cast<std::uintptr_t>(A), b0 = reinterpret_cast<std::uintptr_t>(B),
             c0 = reinterpret_cast<std::uintptr_t>(C);
  Kokkos::parallel_for(
      "ops::gemm_batch_pointers", Kokkos::RangePolicy<Kokkos::Cuda>(0, n), KOKKOS_LAMBDA(std::int64_t p) {
        std::int64_t q = p, oa = 0, ob = 0, oc = 0;
        for (int l = nl - 1; l >= 0; --l) {
          const std::int64_t i = q % count[l];
          q /= count[l];
          oa += i * sa[l];
          ob += i * sb[l];
          oc += i * sc[l];
        }
        v(p) = b0 + static_cast<std::uintptr_t>(ob * bytes);
        v(n + p) = a0 + static_cast<std::uintptr_t>(oa * bytes);
        v(2 * n + p) = c0 + static_cast<std::uintptr_t>(oc * static_cast<std::int64_t>(sizeof(float)));
      });
  return kept.emplace(std::move(key), v).first->second;
}
}  // namespace

void gemm_mixed_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, GemmOperand A,
                        std::int64_t lda, GemmOperand B, std::int64_t ldb, float beta, float* C, std::int64_t ldc,
                        const GemmBatch& batch) {
  if (A.dt != B.dt) throw Error::one("internal: gemm_mixed_batched with operands of different types");
  const GemmBatch m = batch.merged();
  const std::int64_t n = m.products();
  if (M == 0 || N == 0 || n == 0) return;
  if (m.levels.size() <= 1) {
    const GemmBatchLevel l = m.levels.empty() ? GemmBatchLevel{} : m.levels[0];
    if (l.count > 1 && l.c == 0) batch.check_outputs();  // names the clash
    const GemmRegion region(gemm_batched_region(A.dt), ta, tb, M, N, K, beta, n);
    TRIDENT_CUBLAS(cublasGemmStridedBatchedEx(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M),
                                              static_cast<int>(K), &alpha, B.p, cuda_type(B.dt), static_cast<int>(ldb),
                                              l.b, A.p, cuda_type(A.dt), static_cast<int>(lda), l.a, &beta, C,
                                              CUDA_R_32F, static_cast<int>(ldc), l.c, static_cast<int>(n),
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const PointerView& ptrs = batch_pointers(A.p, B.p, C, dtype_bytes(A.dt), m);
  const GemmRegion region(gemm_batched_region(A.dt), ta, tb, M, N, K, beta, n);
  const auto* b = reinterpret_cast<const void* const*>(ptrs.data());
  const auto* a = reinterpret_cast<const void* const*>(ptrs.data() + n);
  void* const* c = reinterpret_cast<void* const*>(ptrs.data() + 2 * n);
  TRIDENT_CUBLAS(cublasGemmBatchedEx(handle(), op(tb), op(ta), static_cast<int>(N), static_cast<int>(M),
                                     static_cast<int>(K), &alpha, b, cuda_type(B.dt), static_cast<int>(ldb), a,
                                     cuda_type(A.dt), static_cast<int>(lda), &beta, c, CUDA_R_32F,
                                     static_cast<int>(ldc), static_cast<int>(n), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
}

namespace {
// The device copies of a grouped call's pointer arrays (cuBLAS reads A, B and C's addresses from
// device memory), grown as needed and reused: deep_copy fences, so a reuse never overwrites
// the pointers of a call still queued.
Kokkos::View<std::uintptr_t*, Kokkos::LayoutRight, Kokkos::CudaSpace>& grouped_pointers(std::size_t n) {
  static Kokkos::View<std::uintptr_t*, Kokkos::LayoutRight, Kokkos::CudaSpace> v;
  if (v.extent(0) < n)
    v = Kokkos::View<std::uintptr_t*, Kokkos::LayoutRight, Kokkos::CudaSpace>("ops::gemm_grouped_ptrs", n);
  return v;
}

// One cuBLAS grouped call for `work` (each a group of one GEMM): cublasSgemmGroupedBatched for
// fp32, cublasGemmGroupedBatchedEx (16-bit A and B, fp32 C, fp32 compute) for bf16 / fp16.
// Returns false, having computed nothing, when cuBLAS refuses the call's types
// (CUBLAS_STATUS_NOT_SUPPORTED / INVALID_VALUE): the caller then runs one GEMM per group.
bool gemm_grouped_cublas(Trans ta, Trans tb, float alpha, float beta, const std::vector<const GemmGroup*>& work) {
  const int n = static_cast<int>(work.size());
  const DType dt = work[0]->A.dt;
  // row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T (see gemm())
  std::vector<cublasOperation_t> opa(n, op(tb)), opb(n, op(ta));
  std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
  std::vector<float> alphas(n, alpha), betas(n, beta);
  auto& ptrs = grouped_pointers(3 * static_cast<std::size_t>(n));
  auto host = Kokkos::create_mirror_view(ptrs);
  for (int i = 0; i < n; ++i) {
    const GemmGroup& g = *work[i];
    m[i] = static_cast<int>(g.N);
    nn[i] = static_cast<int>(g.M);
    k[i] = static_cast<int>(g.K);
    lda[i] = static_cast<int>(g.ldb);
    ldb[i] = static_cast<int>(g.lda);
    ldc[i] = static_cast<int>(g.ldc);
    host(i) = reinterpret_cast<std::uintptr_t>(g.B.p);
    host(n + i) = reinterpret_cast<std::uintptr_t>(g.A.p);
    host(2 * n + i) = reinterpret_cast<std::uintptr_t>(g.C);
  }
  Kokkos::deep_copy(ptrs, host);
  const auto* a = reinterpret_cast<const void* const*>(ptrs.data());
  const auto* b = reinterpret_cast<const void* const*>(ptrs.data() + n);
  void* const* c = reinterpret_cast<void* const*>(ptrs.data() + 2 * n);
  cublasStatus_t st;
  if (dt == DType::F32) {
    const GemmRegion region("ops::gemm_grouped");
    st = cublasSgemmGroupedBatched(handle(), opa.data(), opb.data(), m.data(), nn.data(), k.data(), alphas.data(),
                                   reinterpret_cast<const float* const*>(a), lda.data(),
                                   reinterpret_cast<const float* const*>(b), ldb.data(), betas.data(),
                                   reinterpret_cast<float* const*>(c), ldc.data(), n, size.data());
  } else {
    const cudaDataType type = dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const GemmRegion region(dt == DType::BF16 ? "ops::gemm_bf16_grouped" : "ops::gemm_fp16_grouped");
    st = cublasGemmGroupedBatchedEx(handle(), opa.data(), opb.data(), m.data(), nn.data(), k.data(), alphas.data(), a,
                                    type, lda.data(), b, type, ldb.data(), betas.data(), c, CUDA_R_32F, ldc.data(), n,
                                    size.data(), CUBLAS_COMPUTE_32F);
  }
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return false;
  TRIDENT_CUBLAS(st);
  return true;
}
}  // namespace

void gemm_mixed_grouped(Trans ta, Trans tb, float alpha, float beta, const std::vector<GemmGroup>& groups) {
  std::vector<const GemmGroup*> work;
  bool one_type = true;
  for (const GemmGroup& g : groups) {
    if (g.M < 0 || g.N < 0 || g.K < 0) {
      std::ostringstream os;
      os << "gemm: negative dimension M=" << g.M << " N=" << g.N << " K=" << g.K;
      throw Error::one(os.str());
    }
    if (g.M == 0 || g.N == 0) continue;
    if (g.K == 0) {
      gemm_grouped_scale(beta, g);
      continue;
    }
    one_type = one_type && g.A.dt == g.B.dt && g.A.dt == groups.front().A.dt;
    work.push_back(&g);
  }
  // Types cuBLAS refused once are not tried again (a 16-bit grouped call without fp32 output).
  static bool refused[3] = {false, false, false};
  if (work.size() > 1 && one_type) {
    bool& no = refused[static_cast<int>(work[0]->A.dt)];
    if (!no && gemm_grouped_cublas(ta, tb, alpha, beta, work)) return;
    no = true;
  }
  for (const GemmGroup* g : work)
    gemm_mixed(ta, tb, g->M, g->N, g->K, alpha, g->A, g->lda, g->B, g->ldb, beta, g->C, g->ldc);
}

void gemm_set_tf32(bool on) {
  TRIDENT_CUBLAS(cublasSetMathMode(handle(), on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

const char* gemm_backend_name() { return "cuBLAS"; }

}  // namespace trident
