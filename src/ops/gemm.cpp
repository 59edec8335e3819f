// Host GEMM through oneDNN (dnnl_sgemm, row-major, picks AVX-512/AMX kernels at run time) or a
// CBLAS (OpenBLAS) fallback. bf16 products go to oneDNN's bf16 matmul where this CPU has one, and
// are otherwise widened to fp32 and multiplied by the fp32 GEMM (docs/DESIGN.md "Mixed
// precision"). The CUDA build uses gemm_cuda.cpp instead.
#include "ops/gemm.hpp"

#include <Kokkos_Core.hpp>
#include <sstream>

#include "common/error.hpp"
#include "common/half.hpp"
#include "ops/gemm_region.hpp"

#if !defined(TRIDENT_ENABLE_CUDA)
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <algorithm>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(TRIDENT_GEMM_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#else
#include <cblas.h>
#endif

namespace trident {

namespace {
void check_dims(std::int64_t M, std::int64_t N, std::int64_t K) {
  if (M < 0 || N < 0 || K < 0) {
    std::ostringstream os;
    os << "gemm: negative dimension M=" << M << " N=" << N << " K=" << K;
    throw Error::one(os.str());
  }
}
#if defined(TRIDENT_GEMM_DNNL)
char dnnl_trans(Trans t) { return t == Trans::T ? 'T' : 'N'; }
[[noreturn]] void dnnl_failed(dnnl_status_t st, std::int64_t M, std::int64_t N, std::int64_t K, const char* what) {
  std::ostringstream os;
  os << "dnnl_sgemm failed (status " << static_cast<int>(st) << ") M=" << M << " N=" << N << " K=" << K << what;
  throw Error::one(os.str());
}
#endif

#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
// The batched GEMMs share their batch (attention's per-head products, 64 x 64 x 64 at GPT-2's
// shapes) out over this rank's threads, each product whole on one thread (oneDNN runs
// sequentially inside a parallel region), rather than splitting every small product over all
// threads in turn: the kernels of one thread, so the bits of one thread, whatever the thread
// count (validation/identity.py --threads).
bool share_batch(std::int64_t batch, std::int64_t M, std::int64_t N) {
  return batch > 1 && M > 0 && N > 0 && omp_get_max_threads() > 1 && !omp_in_parallel();
}

// Runs product(b, state) for every b in [0, batch), statically scheduled over the threads, where
// `state` is the thread's own make_state() result.
// An exception does not leave the parallel region: the first one's message is returned, empty
// when none.
template <class MakeState, class Product>
std::string run_batch_on_threads(std::int64_t batch, const MakeState& make_state, const Product& product) {
  std::string first_error;
  const auto record = [&first_error](const char* what) {
#pragma omp critical(trident_gemm_error)
    if (first_error.empty()) first_error = what;
  };
#pragma omp parallel
  {
    // Every thread reaches the worksharing loop, even one whose state could not be made.
    std::optional<decltype(make_state())> state;
    try {
      state.emplace(make_state());
    } catch (const std::exception& e) {
      record(e.what());
    }
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < batch; ++b) {
      if (!state) continue;
      try {
        product(b, *state);
      } catch (const std::exception& e) {
        record(e.what());
      }
    }
  }
  return first_error;
}

// A large fp32 GEMM is cut into one slab of C per thread, each computed whole by oneDNN on its
// thread: op(B) transposed (y = x W^T, the forward of every linear) by columns, otherwise by
// rows. Measured on Zen 5 at 2 threads (perf/results/host_threads_2026-12-02.md, seventh step),
// oneDNN's own split of these shapes is slower: fc2's forward (256 x 768 x 3072, NT) 4.6 ms
// against 3.25, the LM head's forward 58.7 ms against 51, its weight gradient (TN) 49.2 against
// 46.3; rows and columns otherwise within 2% of it. Where oneDNN runs its AVX-512 kernels, each
// element of a slab was, on every shape tried, the element of the whole product computed on one
// thread (oneDNN 2.6 blocks K the same way for both), so the bits are those of one thread at any
// thread count; oneDNN's own split does not give that (100 x 1000 x 1000, NT: its 2-thread result
// differs from its 1-thread one). oneDNN 2.6's AVX2 kernels choose their blocking by the sizes
// they are given, so there a slab may sum in another order than the whole product (measured on
// AMD Zen 3: the weight gradients, TN with K = 256, whether cut by rows or by columns; 600 x 300
// x 500 NN and TN cut by rows): the result is that of the slabs, each on one thread, and may
// differ from one thread's in the last bits. Unit Gemm.LargeProductsAtTwoThreadsGiveTheBitsOfOneThread
// and validation/identity.py --threads check it. Slabs are at least kMinSlab wide and edges fall
// on multiples of 16 (a cache line of floats); a smaller product runs whole on one thread.
struct Slabs {
  bool by_columns = false;
  std::int64_t count = 0;  // 0: no split
  std::int64_t extent = 0;
  std::int64_t edge(std::int64_t s) const { return s >= count ? extent : extent * s / count / 16 * 16; }
};

Slabs gemm_slabs(Trans tb, std::int64_t M, std::int64_t N, std::int64_t K) {
  constexpr std::int64_t kMinSlab = 128;
  constexpr double kMinFlopsPerThread = 2e7;
  Slabs s;
  if (omp_in_parallel()) return s;
  const std::int64_t threads = omp_get_max_threads();
  s.by_columns = tb == Trans::T;
  s.extent = s.by_columns ? N : M;
  if (threads > 1 && s.extent >= threads * kMinSlab &&
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >= kMinFlopsPerThread * threads)
    s.count = threads;
  return s;
}
#endif
}  // namespace

namespace {
// C = alpha op(A) op(B) + beta C on this rank's threads (no region, dimensions checked by the
// caller): gemm()'s work, and the fp32 product of the widened bf16 path.
void sgemm_host(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
#if defined(TRIDENT_GEMM_DNNL)
#if defined(_OPENMP)
  if (const Slabs slabs = gemm_slabs(tb, M, N, K); slabs.count > 1) {
    struct NoState {};
    const std::string error = run_batch_on_threads(
        slabs.count, [] { return NoState{}; },
        [&](std::int64_t s, NoState&) {
          const std::int64_t lo = slabs.edge(s), n = slabs.edge(s + 1) - lo;
          // columns [lo, lo + n) of C come from those of op(B); rows from those of op(A)
          const float* a = slabs.by_columns ? A : A + (ta == Trans::T ? lo : lo * lda);
          const float* b = !slabs.by_columns ? B : B + (tb == Trans::T ? lo * ldb : lo);
          float* c = slabs.by_columns ? C + lo : C + lo * ldc;
          const std::int64_t m = slabs.by_columns ? M : n, nn = slabs.by_columns ? n : N;
          const dnnl_status_t st = dnnl_sgemm(dnnl_trans(ta), dnnl_trans(tb), m, nn, K, alpha, a, lda, b, ldb, beta, c,
                                              ldc);
          if (st != dnnl_success) dnnl_failed(st, m, nn, K, " (one thread's slab)");
        });
    if (!error.empty()) throw Error::one(error);
    return;
  }
  // A product too small to cut runs whole on one thread (oneDNN's own split of it may sum in
  // another order than one thread: measured on AVX2 CPUs, 40 x 48 x 64 at 2 threads).
  struct OneThread {
    int threads = omp_get_max_threads();
    OneThread() {
      if (threads > 1) omp_set_num_threads(1);
    }
    ~OneThread() {
      if (threads > 1) omp_set_num_threads(threads);
    }
  };
  const OneThread one_thread;
#endif
  const dnnl_status_t st = dnnl_sgemm(dnnl_trans(ta), dnnl_trans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success) dnnl_failed(st, M, N, K, "");
#else
  cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans, tb == Trans::T ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
#endif
}
}  // namespace

void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  const GemmRegion region("ops::gemm", ta, tb, M, N, K, beta);
  sgemm_host(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, std::int64_t strideA, const float* B, std::int64_t ldb,
                          std::int64_t strideB, float beta, float* C, std::int64_t ldc, std::int64_t strideC,
                          std::int64_t batch) {
  check_dims(M, N, K);
#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
  if (share_batch(batch, M, N)) {
    const GemmRegion region("ops::gemm", ta, tb, M, N, K, beta, batch);
    struct NoState {};
    const std::string error = run_batch_on_threads(
        batch, [] { return NoState{}; },
        [&](std::int64_t b, NoState&) {
          const dnnl_status_t st = dnnl_sgemm(dnnl_trans(ta), dnnl_trans(tb), M, N, K, alpha, A + b * strideA, lda,
                                              B + b * strideB, ldb, beta, C + b * strideC, ldc);
          if (st != dnnl_success) dnnl_failed(st, M, N, K, " (batched)");
        });
    if (!error.empty()) throw Error::one(error);
    return;
  }
#endif
  const GemmRegion region("ops::gemm", ta, tb, M, N, K, beta, batch);  // the products' own are not pushed
  for (std::int64_t b = 0; b < batch; ++b)
    gemm(ta, tb, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb, beta, C + b * strideC, ldc);
}

namespace {
// ---- bf16 products widened to fp32 ----
// Where oneDNN has no bf16 matmul (oneDNN 2.6 creates none below AVX-512: AVX2 CPUs such as AMD
// Zen 2 and 3 or Intel before Skylake-SP, or ONEDNN_MAX_CPU_ISA=AVX2), and in CBLAS builds, a bf16
// product is the fp32 GEMM of its widened operands: bf16 -> fp32 is exact (a shift of the word),
// and so is the product of two bf16 values in fp32 (8 + 8 significant bits), so the fp32 GEMM
// computes the same products with fp32 accumulation. The operand that is not cut (the smaller) is
// widened whole; the larger is widened in chunks of at most kWidenChunk values along its free
// dimension (op(A)'s rows, op(B)'s columns), each chunk's slice of C computed before the next is
// widened, so the widened copies stay bounded and recently written. The cuts depend on the shape
// alone. Called from one thread, the widening and each chunk's fp32 GEMM (sgemm_host, its slabs)
// use this rank's threads; inside a parallel region (a batch's or a group's product on its thread)
// everything runs on the calling thread, as sgemm_host does there.
constexpr std::int64_t kWidenChunk = std::int64_t{1} << 22;
constexpr std::int64_t kWidenThreadedMin = std::int64_t{1} << 16;  // values: below, one thread widens

// rows x cols of src (row stride ld) into dst (row stride cols)
void widen_bf16(const std::uint16_t* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* dst) {
  const auto row = [=](std::int64_t r) {
    const std::uint16_t* s = src + r * ld;
    float* d = dst + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) d[c] = bf16_to_float(s[c]);
  };
#if defined(_OPENMP)
  if (rows > 1 && rows * cols >= kWidenThreadedMin && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) row(r);
    return;
  }
#endif
  for (std::int64_t r = 0; r < rows; ++r) row(r);
}

// A block of a stored operand: rows x cols from p at row stride ld.
struct Block {
  const std::uint16_t* p;
  std::int64_t rows, cols, ld;
};
// op(X)'s rows [lo, hi) (X stored row-major with row stride ld, `rows` x `cols` as op(X) when not
// transposed) as a stored block: whole rows of X, or its columns [lo, hi) when transposed.
Block op_rows(const std::uint16_t* X, Trans t, std::int64_t lo, std::int64_t hi, std::int64_t inner, std::int64_t ld) {
  return t == Trans::N ? Block{X + lo * ld, hi - lo, inner, ld} : Block{X + lo, inner, hi - lo, ld};
}

void widened_bf16_gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                       const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta,
                       float* C, std::int64_t ldc) {
  static thread_local std::vector<float> whole, part;
  // cut op(B) by columns when it is the larger operand, else op(A) by rows
  const bool cut_b = N >= M;
  const std::int64_t extent = cut_b ? N : M;
  const std::int64_t step = extent * K <= kWidenChunk
                                ? extent
                                : std::max<std::int64_t>(16, kWidenChunk / std::max<std::int64_t>(K, 1) / 16 * 16);
  // op(B)'s columns are the rows of B^T: op_rows on B with the transpose flipped
  const Trans tbt = tb == Trans::T ? Trans::N : Trans::T;
  const Block w = cut_b ? op_rows(A, ta, 0, M, K, lda) : op_rows(B, tbt, 0, N, K, ldb);
  whole.resize(static_cast<size_t>(std::max<std::int64_t>(w.rows * w.cols, 1)));
  widen_bf16(w.p, w.rows, w.cols, w.ld, whole.data());
  for (std::int64_t lo = 0; lo < extent; lo += step) {
    const std::int64_t hi = std::min(extent, lo + step);
    const Block c = cut_b ? op_rows(B, tbt, lo, hi, K, ldb) : op_rows(A, ta, lo, hi, K, lda);
    part.resize(static_cast<size_t>(std::max<std::int64_t>(c.rows * c.cols, 1)));
    widen_bf16(c.p, c.rows, c.cols, c.ld, part.data());
    const float* a = cut_b ? whole.data() : part.data();
    const float* b = cut_b ? part.data() : whole.data();
    const std::int64_t m = cut_b ? M : hi - lo, n = cut_b ? hi - lo : N;
    const std::int64_t la = cut_b ? w.cols : c.cols, lb = cut_b ? c.cols : w.cols;
    sgemm_host(ta, tb, m, n, K, alpha, a, la, b, lb, beta, cut_b ? C + lo : C + lo * ldc, ldc);
  }
}
}  // namespace

#if defined(TRIDENT_GEMM_DNNL)
namespace {
// One oneDNN matmul primitive per distinct GEMM (shape, transposes, strides, alpha, beta),
// created on first use. A transpose is a stride swap of the memory descriptor. `concurrent`
// primitives (for the batched GEMM) take their scratchpad from the caller, which oneDNN requires
// of a primitive executed by several threads at once (scratchpad_mode::user).
using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       float, float, bool>;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct Bf16Gemm {
  Trans ta, tb;
  std::int64_t M, N, K;
  float alpha;
  std::int64_t lda, ldb;
  float beta;
  std::int64_t ldc;

  dnnl::memory::desc a() const { return desc(M, K, ta == Trans::T, lda, dnnl::memory::data_type::bf16); }
  dnnl::memory::desc b() const { return desc(K, N, tb == Trans::T, ldb, dnnl::memory::data_type::bf16); }
  dnnl::memory::desc c() const { return desc(M, N, false, ldc, dnnl::memory::data_type::f32); }
  // rows x cols stored row-major with row stride ld, or its transpose
  static dnnl::memory::desc desc(std::int64_t rows, std::int64_t cols, bool trans, std::int64_t ld,
                                 dnnl::memory::data_type type) {
    using dims = dnnl::memory::dims;
    return {dims{rows, cols}, type, trans ? dims{1, ld} : dims{ld, 1}};
  }
};

// Whether oneDNN has a bf16 matmul on this CPU (under ONEDNN_MAX_CPU_ISA, if set): asked once, by
// creating one small primitive. oneDNN 2.6 has none below AVX-512 (avx512_core); then every bf16
// product is widened (widened_bf16_gemm) without trying its shape.
bool bf16_matmul_available() {
  static const bool available = [] {
    try {
      const Bf16Gemm g{Trans::N, Trans::T, 16, 16, 16, 1.f, 16, 16, 0.f, 16};
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g.a(), g.b(), g.c()), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

struct Bf16Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc scratchpad;  // concurrent primitives only
};

// The cached primitive of this GEMM, or null where oneDNN creates none for it (no bf16 matmul on
// this CPU, or none for this shape and these strides): the caller widens instead. Remembered either
// way, so a shape is tried once.
const Bf16Matmul* bf16_matmul(const Bf16Gemm& g, bool concurrent) {
  if (!bf16_matmul_available()) return nullptr;
  static std::map<Key, std::optional<Bf16Matmul>> cache;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{g.ta == Trans::T, g.tb == Trans::T, g.M, g.N, g.K, g.lda, g.ldb, g.ldc, g.alpha, g.beta, concurrent};
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::optional<Bf16Matmul> made;
    try {
      dnnl::primitive_attr attr;
      if (g.alpha != 1.f) attr.set_output_scales(0, {g.alpha});
      if (g.beta != 0.f) {
        dnnl::post_ops po;
        po.append_sum(g.beta);
        attr.set_post_ops(po);
      }
      if (concurrent) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g.a(), g.b(), g.c()), attr, cpu_engine());
      made = Bf16Matmul{dnnl::matmul(pd), concurrent ? pd.scratchpad_desc() : dnnl::memory::desc()};
    } catch (const dnnl::error&) {
      // no primitive for this one: widened
    }
    it = cache.emplace(key, std::move(made)).first;
  }
  return it->second ? &*it->second : nullptr;
}

// Executes a cached primitive on one product after another: its memory objects, stream and (for a
// concurrent primitive) the scratchpad are made once, and each product only repoints the memory
// objects at its operands. Not shared between threads. dnnl::error is left to the caller.
class Bf16Executor {
 public:
  Bf16Executor(const Bf16Gemm& g, const Bf16Matmul& mm)
      : mm_(&mm), stream_(cpu_engine()), a_(g.a(), cpu_engine(), DNNL_MEMORY_NONE),
        b_(g.b(), cpu_engine(), DNNL_MEMORY_NONE), c_(g.c(), cpu_engine(), DNNL_MEMORY_NONE) {
    if (!mm.scratchpad.is_zero()) {
      buffer_.resize(std::max<size_t>(mm.scratchpad.get_size(), 1));
      scratch_ = dnnl::memory(mm.scratchpad, cpu_engine(), buffer_.data());
    }
  }

  // C = alpha op(A) op(B) + beta C
  void operator()(const std::uint16_t* A, const std::uint16_t* B, float* C) {
    a_.set_data_handle(const_cast<std::uint16_t*>(A));
    b_.set_data_handle(const_cast<std::uint16_t*>(B));
    c_.set_data_handle(C);
    // The C API takes the arguments as an array, where the C++ one wants an unordered_map.
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, a_.get()},
                                    {DNNL_ARG_WEIGHTS, b_.get()},
                                    {DNNL_ARG_DST, c_.get()},
                                    {DNNL_ARG_SCRATCHPAD, scratch_.get(true)}};
    const int nargs = scratch_ ? 4 : 3;
    dnnl::error::wrap_c_api(dnnl_primitive_execute(mm_->prim.get(), stream_.get(), nargs, args),
                            "could not execute a primitive");
    stream_.wait();
  }

 private:
  const Bf16Matmul* mm_;
  dnnl::stream stream_;
  dnnl::memory a_, b_, c_, scratch_;
  std::vector<char> buffer_;
};

[[noreturn]] void bf16_failed(const char* what, const Bf16Gemm& g, std::int64_t batch) {
  std::ostringstream os;
  os << "oneDNN bf16 matmul failed (" << what << ") M=" << g.M << " N=" << g.N << " K=" << g.K;
  if (batch != 1) os << " batch=" << batch;
  throw Error::one(os.str());
}
}  // namespace
#endif

void gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  const GemmRegion region("ops::gemm_bf16", ta, tb, M, N, K, beta);
#if defined(TRIDENT_GEMM_DNNL)
  const Bf16Gemm g{ta, tb, M, N, K, alpha, lda, ldb, beta, ldc};
  if (const Bf16Matmul* mm = bf16_matmul(g, false)) {
    try {
      Bf16Executor(g, *mm)(A, B, C);
    } catch (const dnnl::error& e) {
      bf16_failed(e.what(), g, 1);
    }
    return;
  }
#endif
  widened_bf16_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_widened(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                       const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta,
                       float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  const GemmRegion region("ops::gemm_bf16", ta, tb, M, N, K, beta);
  widened_bf16_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool gemm_bf16_native() {
#if defined(TRIDENT_GEMM_DNNL)
  return bf16_matmul_available();
#else
  return false;
#endif
}

void gemm_bf16_strided_batched(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                               const std::uint16_t* A, std::int64_t lda, std::int64_t strideA, const std::uint16_t* B,
                               std::int64_t ldb, std::int64_t strideB, float beta, float* C, std::int64_t ldc,
                               std::int64_t strideC, std::int64_t batch) {
  check_dims(M, N, K);
#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
  if (share_batch(batch, M, N)) {
    // One primitive executed by all the threads, each with its own scratchpad; or, where oneDNN has
    // none, each product widened on its thread.
    const GemmRegion region("ops::gemm_bf16", ta, tb, M, N, K, beta, batch);
    const Bf16Gemm g{ta, tb, M, N, K, alpha, lda, ldb, beta, ldc};
    std::string error;
    try {
      if (const Bf16Matmul* mm = bf16_matmul(g, true)) {
        error = run_batch_on_threads(
            batch, [&] { return Bf16Executor(g, *mm); },
            [&](std::int64_t b, Bf16Executor& run) { run(A + b * strideA, B + b * strideB, C + b * strideC); });
      } else {
        struct NoState {};
        error = run_batch_on_threads(
            batch, [] { return NoState{}; },
            [&](std::int64_t b, NoState&) {
              widened_bf16_gemm(ta, tb, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb, beta,
                                C + b * strideC, ldc);
            });
      }
    } catch (const dnnl::error& e) {
      error = e.what();
    }
    if (!error.empty()) bf16_failed(error.c_str(), g, batch);
    return;
  }
#endif
  const GemmRegion region("ops::gemm_bf16", ta, tb, M, N, K, beta, batch);  // the products' own are not pushed
  for (std::int64_t b = 0; b < batch; ++b)
    gemm_bf16(ta, tb, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb, beta, C + b * strideC, ldc);
}

void gemm_fp16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const std::uint16_t* A,
               std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_dims(M, N, K);
  if (M == 0 || N == 0) return;
  // fp16 values widen exactly to fp32: sgemm on the widened operands computes the same
  // products with fp32 accumulation. Buffers are reused between calls.
  static thread_local std::vector<float> a, b;
  const std::int64_t ar = ta == Trans::T ? K : M, br = tb == Trans::T ? N : K;
  a.resize(static_cast<size_t>(ar * lda));
  b.resize(static_cast<size_t>(br * ldb));
  for (size_t i = 0; i < a.size(); ++i) a[i] = fp16_to_float(A[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = fp16_to_float(B[i]);
  gemm(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
namespace {
// The groups of a grouped GEMM shared out over this rank's threads, each GEMM whole on one thread
// (as the batched GEMMs share their batch): the longest-processing-time rule in products
// M·N·K, ties to the lower group and the lower thread, so the assignment is a function of the
// shapes. Used when it balances the threads within 25% of an even split, or when no group is
// large enough for gemm()'s own split into slabs (then the groups would run one thread at a
// time). fp32 and bf16 operands (bf16 widened where oneDNN has no bf16 matmul, each group on its
// thread); fp16 (widened to fp32 per call) keeps one GEMM after another.
// Empty when the groups are better left to run one after another.
std::vector<std::vector<const GemmGroup*>> share_groups(Trans tb, const std::vector<const GemmGroup*>& work) {
  const std::int64_t threads = omp_get_max_threads();
  if (threads < 2 || omp_in_parallel() || work.size() < 2) return {};
  for (const GemmGroup* g : work)
    if (g->A.dt == DType::F16 || g->A.dt != g->B.dt) return {};
  const auto cost = [](const GemmGroup* g) { return static_cast<double>(g->M) * g->N * g->K; };
  std::vector<size_t> order(work.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost(work[a]) > cost(work[b]); });
  std::vector<std::vector<const GemmGroup*>> per_thread(static_cast<size_t>(threads));
  std::vector<double> load(static_cast<size_t>(threads), 0.0);
  double total = 0.0;
  bool any_slabs = false;
  for (size_t i : order) {
    const size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    per_thread[t].push_back(work[i]);
    load[t] += cost(work[i]);
    total += cost(work[i]);
    // fp32 groups, and bf16 ones widened to fp32 where oneDNN has no bf16 matmul, are cut into slabs
    const bool fp32_gemm = work[i]->A.dt == DType::F32 || !bf16_matmul_available();
    any_slabs = any_slabs || (fp32_gemm && gemm_slabs(tb, work[i]->M, work[i]->N, work[i]->K).count > 1);
  }
  const double makespan = *std::max_element(load.begin(), load.end());
  if (any_slabs && makespan > 1.25 * total / static_cast<double>(threads)) return {};
  return per_thread;
}
}  // namespace
#endif

void gemm_mixed_grouped(Trans ta, Trans tb, float alpha, float beta, const std::vector<GemmGroup>& groups) {
  std::vector<const GemmGroup*> work;
  for (const GemmGroup& g : groups) {
    check_dims(g.M, g.N, g.K);
    if (g.M == 0 || g.N == 0) continue;
    if (g.K == 0) {
      gemm_grouped_scale(beta, g);
      continue;
    }
    work.push_back(&g);
  }
#if defined(TRIDENT_GEMM_DNNL) && defined(_OPENMP)
  if (const auto per_thread = share_groups(tb, work); !per_thread.empty()) {
    const GemmRegion region("ops::gemm_grouped");
    struct NoState {};
    const std::string error = run_batch_on_threads(
        static_cast<std::int64_t>(per_thread.size()), [] { return NoState{}; },
        [&](std::int64_t t, NoState&) {
          for (const GemmGroup* g : per_thread[static_cast<size_t>(t)]) {
            if (g->A.dt == DType::F32) {
              const dnnl_status_t st = dnnl_sgemm(dnnl_trans(ta), dnnl_trans(tb), g->M, g->N, g->K, alpha,
                                                  static_cast<const float*>(g->A.p), g->lda,
                                                  static_cast<const float*>(g->B.p), g->ldb, beta, g->C, g->ldc);
              if (st != dnnl_success) dnnl_failed(st, g->M, g->N, g->K, " (grouped)");
            } else {  // bf16: a concurrent primitive (its own scratchpad), as the batched GEMM runs it
              const Bf16Gemm b{ta, tb, g->M, g->N, g->K, alpha, g->lda, g->ldb, beta, g->ldc};
              const auto* a16 = static_cast<const std::uint16_t*>(g->A.p);
              const auto* b16 = static_cast<const std::uint16_t*>(g->B.p);
              try {
                if (const Bf16Matmul* mm = bf16_matmul(b, true))
                  Bf16Executor(b, *mm)(a16, b16, g->C);
                else
                  widened_bf16_gemm(ta, tb, g->M, g->N, g->K, alpha, a16, g->lda, b16, g->ldb, beta, g->C, g->ldc);
              } catch (const dnnl::error& e) {
                bf16_failed(e.what(), b, 1);
              }
            }
          }
        });
    if (!error.empty()) throw Error::one(error);
    return;
  }
#endif
  const GemmRegion region("ops::gemm_grouped");  // the groups' own are not pushed
  for (const GemmGroup* g : work)
    gemm_mixed(ta, tb, g->M, g->N, g->K, alpha, g->A, g->lda, g->B, g->ldb, beta, g->C, g->ldc);
}

void gemm_set_tf32(bool) {}

#if defined(TRIDENT_GEMM_DNNL)
namespace {
const char* dnnl_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}
}  // namespace
#endif

const char* gemm_backend_name() {
  static const std::string name = [] {
    std::ostringstream os;
#if defined(TRIDENT_GEMM_DNNL)
    const dnnl_version_t* v = dnnl_version();
    os << "oneDNN " << v->major << "." << v->minor << "." << v->patch << " sgemm ("
       << dnnl_isa_name(dnnl_get_effective_cpu_isa()) << "); bf16: "
       << (gemm_bf16_native() ? "oneDNN bf16 matmul"
                              : "widened to fp32 sgemm (this oneDNN has no bf16 matmul on this CPU)");
#else
    os << "CBLAS sgemm; bf16: widened to fp32 sgemm";
#endif
    return os.str();
  }();
  return name.c_str();
}

}  // namespace trident
#endif
