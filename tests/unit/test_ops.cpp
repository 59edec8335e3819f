// Every op: forward against a naive double-precision reference, backward against central
// finite differences (see test_helpers.hpp for the step and the error it implies).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/device_parallel.hpp"
#include "common/error.hpp"
#include "ops/attention.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/elementwise.hpp"
#include "ops/embedding.hpp"
#include "ops/gelu.hpp"
#include "common/half.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_lt.hpp"
#include "ops/layernorm.hpp"
#include "ops/mixed_precision.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;

// fp32 forward vs double reference: sums of <= 64 O(1) terms, so ~1e-6 relative; 1e-5 leaves margin.
constexpr double kFwdRtol = 1e-5, kFwdAtol = 1e-5;
// FD with h = 1e-2 in fp32: truncation ~1e-4 * f''', rounding ~6e-8 * |f| / 1e-2 ~ 1e-4 for |f| ~ 10.
constexpr double kGradRtol = 2e-3, kGradAtol = 2e-3;

TEST(Gemm, AllTransposeCombinationsMatchNaive) {
  const std::int64_t M = 5, N = 7, K = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // stored shapes: A is (M,K) or (K,M); B is (K,N) or (N,K); padded leading dimensions
      const std::int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
      auto A = random_vector((ta ? K : M) * lda, 1), B = random_vector((tb ? N : K) * ldb, 2),
           C = random_vector(M * ldc, 3);
      std::vector<double> want(C.begin(), C.end());
      const float alpha = 0.7f, beta = 0.3f;
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (std::int64_t k = 0; k < K; ++k)
            s += static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
          want[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
        }
      auto dA = to_device(A), dB = to_device(B), dC = to_device(C);
      gemm(ta ? Trans::T : Trans::N, tb ? Trans::T : Trans::N, M, N, K, alpha, dA.data(), lda, dB.data(), ldb, beta,
           dC.data(), ldc);
      expect_close(as_double(to_host(dC)), want, kFwdRtol, kFwdAtol, "gemm");
    }
}

// bf16 GEMM: inputs rounded to bf16, products exact in fp32 and double, accumulation in fp32
// (tolerance: K * 2^-24 relative to the sum of |products|, here K = 67, far below 1e-5).
TEST(Gemm, Bf16InputsWithFp32AccumulationMatchNaive) {
  const std::int64_t M = 9, N = 13, K = 67;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.f, 1.f, 0.5f}) {
        const std::int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
        auto A = random_vector((ta ? K : M) * lda, 11), B = random_vector((tb ? N : K) * ldb, 12),
             C = random_vector(M * ldc, 13);
        std::vector<std::uint16_t> hA(A.size()), hB(B.size());
        for (size_t i = 0; i < A.size(); ++i) A[i] = bf16_to_float(hA[i] = float_to_bf16(A[i]));
        for (size_t i = 0; i < B.size(); ++i) B[i] = bf16_to_float(hB[i] = float_to_bf16(B[i]));
        const float alpha = beta == 0.5f ? 0.25f : 1.f;
        std::vector<double> want(C.begin(), C.end()), mag(C.size(), 0.0);
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            double s = 0, m = 0;
            for (std::int64_t k = 0; k < K; ++k) {
              const double p = static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]) *
                               (tb ? B[j * ldb + k] : B[k * ldb + j]);
              s += p;
              m += std::fabs(p);
            }
            want[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
            mag[i * ldc + j] = std::fabs(alpha) * m + std::fabs(beta * C[i * ldc + j]);
          }
        const auto dA = to_device(hA), dB = to_device(hB);
        auto dC = to_device(C);
        gemm_bf16(ta ? Trans::T : Trans::N, tb ? Trans::T : Trans::N, M, N, K, alpha, dA.data(), lda, dB.data(), ldb,
                  beta, dC.data(), ldc);
        const auto got = to_host(dC);
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            const double tol = 2.0 * K * 5.96e-8 * mag[i * ldc + j] + 1e-12;
            ASSERT_NEAR(got[i * ldc + j], want[i * ldc + j], tol) << "ta " << ta << " tb " << tb << " beta " << beta;
          }
      }
}

// gemm_mixed_batched over three levels laid out as attention's are (sample b, the head's place t
// in its group, group g; heads side by side in the rows of A, key/value groups side by side in the
// rows of B, which the t level reads again, stride 0), fp32 and bf16 operands, against products
// computed in double from offsets counted out here; beta 1 keeps C's initial values in.
TEST(Gemm, BatchedOverLevelsMatchesNaive) {
  const std::int64_t M = 4, N = 5, K = 6, nb = 2, rep = 2, ng = 3;
  const std::int64_t lda = rep * ng * K + 1, ldb = ng * K + 2, ldc = N + 1, mat = M * ldc;
  const GemmBatch batch{{{nb, M * lda, N * ldb, rep * ng * mat}, {rep, K, 0, mat}, {ng, rep * K, K, rep * mat}}};
  ASSERT_EQ(batch.products(), nb * rep * ng);
  for (DType dt : {DType::F32, DType::BF16}) {
    auto fa = random_vector(nb * M * lda, 31), fb = random_vector(nb * N * ldb, 32);
    const auto fc = random_vector(nb * rep * ng * mat, 33);
    std::vector<std::uint16_t> ha(fa.size()), hb(fb.size());
    if (dt == DType::BF16) {
      for (size_t i = 0; i < fa.size(); ++i) fa[i] = bf16_to_float(ha[i] = float_to_bf16(fa[i]));
      for (size_t i = 0; i < fb.size(); ++i) fb[i] = bf16_to_float(hb[i] = float_to_bf16(fb[i]));
    }
    const auto da = to_device(fa), db = to_device(fb);
    const auto dha = to_device(ha), dhb = to_device(hb);
    auto dc = to_device(fc);
    const GemmOperand A = dt == DType::F32 ? operand(da.data()) : operand(dt, dha.data());
    const GemmOperand B = dt == DType::F32 ? operand(db.data()) : operand(dt, dhb.data());
    gemm_mixed_batched(Trans::N, Trans::T, M, N, K, 0.5f, A, lda, B, ldb, 1.f, dc.data(), ldc, batch);
    const auto got = to_host(dc);
    std::vector<double> want(fc.begin(), fc.end());
    for (std::int64_t b = 0; b < nb; ++b)
      for (std::int64_t t = 0; t < rep; ++t)
        for (std::int64_t g = 0; g < ng; ++g) {
          const std::int64_t h = g * rep + t;  // the query head
          const float* a = fa.data() + b * M * lda + h * K;
          const float* bm = fb.data() + b * N * ldb + g * K;
          double* c = want.data() + (b * rep * ng + h) * mat;
          for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (std::int64_t k = 0; k < K; ++k) s += static_cast<double>(a[i * lda + k]) * bm[j * ldb + k];
              c[i * ldc + j] += 0.5 * s;
            }
        }
    expect_close(as_double(got), want, kFwdRtol, kFwdAtol, dt == DType::F32 ? "fp32 batched" : "bf16 batched");
  }
}

// The batch as data: what merged() folds (a device build's one strided call) and what it leaves as
// levels (its pointer arrays), with the products' offsets in the same order; and a batch with two
// products on one C refused by name.
TEST(Gemm, BatchLevelsMergeOnlyWhereTheStridesContinue) {
  auto offsets = [](const GemmBatch& b) {
    std::vector<std::int64_t> o;
    for (std::int64_t p = 0; p < b.products(); ++p) {
      std::int64_t x = 0, y = 0, z = 0;
      b.offsets(p, x, y, z);
      o.insert(o.end(), {x, y, z});
    }
    return o;
  };
  // contiguous blocks: one level of 12
  const GemmBatch flat{{{4, 60, 30, 21}, {1, 999, 999, 999}, {3, 20, 10, 7}}};
  const GemmBatch fm = flat.merged();
  ASSERT_EQ(fm.levels.size(), 1u);
  EXPECT_EQ(fm.levels[0].count, 12);
  EXPECT_EQ(offsets(fm), offsets(flat));
  // GPT-2's scores at micro-batch 16 (T 1024, 12 heads of 64, rows [q | k | v]): samples and heads do
  // not continue each other (a sample is T rows of 2304, the heads 12 x 64 of one row)
  const std::int64_t T = 1024, ld = 2304, hs = 64, nh = 12;
  const GemmBatch scores{{{16, T * ld, T * ld, nh * T * T}, {1, hs, 0, T * T}, {nh, hs, hs, T * T}}};
  const GemmBatch sm = scores.merged();
  ASSERT_EQ(sm.levels.size(), 2u);
  EXPECT_EQ(sm.levels[0].count, 16);
  EXPECT_EQ(sm.levels[1].count, nh);
  EXPECT_EQ(offsets(sm), offsets(scores));
  EXPECT_NO_THROW(scores.check_outputs());
  // no levels: one product at the bases
  EXPECT_EQ(GemmBatch{}.products(), 1);
  EXPECT_TRUE(GemmBatch{}.merged().levels.empty());
  // a group's key gradient summed over its heads in one call would race: refused
  const GemmBatch clash{{{2, 8, 8, 100}, {3, 1, 1, 0}}};
  try {
    clash.check_outputs();
    FAIL() << "two products on one C accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("write the same C"), std::string::npos) << e.what();
  }
}

// gemm_lt's plan as data: a linear layer's forward (y = x W^T) and weight gradient (dW = dy^T x) as
// cuBLASLt's column-major calls (operands swapped, the transposes, the stored shapes and leading
// dimensions, the bias per row of D = per column of C), and the calls it refuses, by name.
TEST(Gemm, LtPlanIsCublasLtsColumnMajorCall) {
  const std::int64_t rows = 6, in = 4, out = 10;
  std::vector<std::uint16_t> x(rows * in), w(out * in), y(rows * out), aux(rows * out), b(out);
  GemmLt f = lt_call(Trans::N, Trans::T, rows, out, in, operand(DType::BF16, x.data()), in,
                     operand(DType::BF16, w.data()), in, DType::BF16, y.data(), out);
  f.epilogue = Epilogue::GeluAuxBias;
  f.bias = b.data();
  f.bias_dt = DType::BF16;
  f.aux = aux.data();
  f.ldaux = out;
  LtPlan p = lt_plan(f);
  EXPECT_EQ(p.error, "");
  EXPECT_TRUE(p.trans_a);
  EXPECT_FALSE(p.trans_b);
  EXPECT_EQ(std::vector<std::int64_t>({p.m, p.n, p.k}), std::vector<std::int64_t>({out, rows, in}));
  EXPECT_EQ(p.a, static_cast<const void*>(w.data()));  // cuBLASLt's A is W: stored in x out, ld in
  EXPECT_EQ(std::vector<std::int64_t>({p.a_rows, p.a_cols, p.lda}), std::vector<std::int64_t>({in, out, in}));
  EXPECT_EQ(p.b, static_cast<const void*>(x.data()));  // its B is x: in x rows, ld in
  EXPECT_EQ(std::vector<std::int64_t>({p.b_rows, p.b_cols, p.ldb}), std::vector<std::int64_t>({in, rows, in}));
  EXPECT_EQ(p.ldd, out);
  EXPECT_EQ(p.bias_length, out);
  EXPECT_EQ(p.aux_ld, out);
  EXPECT_EQ(p.epilogue, Epilogue::GeluAuxBias);
  // the weight gradient: dW (out, in) = dy^T x, fp32 output, no epilogue
  std::vector<float> dw(out * in);
  p = lt_plan(lt_call(Trans::T, Trans::N, out, in, rows, operand(DType::BF16, y.data()), out,
                      operand(DType::BF16, x.data()), in, DType::F32, dw.data(), in));
  EXPECT_EQ(p.error, "");
  EXPECT_FALSE(p.trans_a);
  EXPECT_TRUE(p.trans_b);
  EXPECT_EQ(std::vector<std::int64_t>({p.m, p.n, p.k}), std::vector<std::int64_t>({in, out, rows}));
  EXPECT_EQ(std::vector<std::int64_t>({p.a_rows, p.a_cols, p.lda}), std::vector<std::int64_t>({in, rows, in}));
  EXPECT_EQ(std::vector<std::int64_t>({p.b_rows, p.b_cols, p.ldb}), std::vector<std::int64_t>({out, rows, out}));
  EXPECT_EQ(p.bias_length, 0);
  // refused, each with its reason
  auto refused = [&](GemmLt c, const char* why) {
    const std::string e = lt_plan(c).error;
    EXPECT_NE(e.find(why), std::string::npos) << "'" << e << "' does not say '" << why << "'";
    EXPECT_THROW(gemm_lt(c), Error);
  };
  GemmLt c = f;
  c.B = operand(reinterpret_cast<const float*>(w.data()));
  refused(c, "operands of different types");
  c = f;
  c.epilogue = Epilogue::Bias;
  c.bias = nullptr;
  refused(c, "without a bias");
  c = f;
  c.aux = nullptr;
  refused(c, "without its pre-activation");
  c = f;
  c.ldc = out - 1;
  refused(c, "ldc");
  c = f;
  c.A = operand(reinterpret_cast<const float*>(x.data()));
  c.B = operand(reinterpret_cast<const float*>(w.data()));
  refused(c, "output of fp32 operands");
}

// gemm_lt's epilogues against their definition in double: C (and the GELU's pre-activation aux)
// within one rounding of the output type of the exact values, for fp32, bf16 and fp16 outputs, with
// a bias of the output's type; the products of 16-bit operands accumulated in fp32.
TEST(Gemm, LtEpiloguesMatchTheirDefinition) {
  const std::int64_t M = 7, N = 12, K = 20, ldc = N + 2;
  const auto fa = random_vector(M * K, 41), fb = random_vector(N * K, 42), fbias = random_vector(N, 43);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (Epilogue ep : {Epilogue::None, Epilogue::Bias, Epilogue::GeluAuxBias}) {
      const bool half = dt != DType::F32;
      auto round = [&](double v) {
        const float f = static_cast<float>(v);
        return !half ? f : dt == DType::BF16 ? bf16_to_float(float_to_bf16(f)) : fp16_to_float(float_to_fp16(f));
      };
      std::vector<float> a(fa), b(fb), bias(fbias);
      for (auto* v : {&a, &b, &bias})
        for (float& x : *v) x = round(x);
      auto words = [&](const std::vector<float>& v) {
        std::vector<std::uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = dt == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
        return h;
      };
      const auto da = to_device(a), db = to_device(b), dbias = to_device(bias);
      const auto ha = to_device(words(a)), hb = to_device(words(b)), hbias = to_device(words(bias));
      FloatView c32 = make_float("c32", M * ldc), aux32 = make_float("aux32", M * ldc);
      HalfView c16 = make_half("c16", M * ldc), aux16 = make_half("aux16", M * ldc);
      GemmLt g = lt_call(Trans::N, Trans::T, M, N, K, half ? operand(dt, ha.data()) : operand(da.data()), K,
                         half ? operand(dt, hb.data()) : operand(db.data()), K, dt,
                         half ? static_cast<void*>(c16.data()) : static_cast<void*>(c32.data()), ldc);
      g.alpha = 0.5f;
      g.epilogue = ep;
      g.bias = half ? static_cast<const void*>(hbias.data()) : static_cast<const void*>(dbias.data());
      g.bias_dt = dt;
      g.aux = half ? static_cast<void*>(aux16.data()) : static_cast<void*>(aux32.data());
      g.ldaux = ldc;
      gemm_lt(g);
      auto host = [&](const FloatView& f32, const HalfView& h16) {
        if (!half) return to_host(f32);
        auto m = Kokkos::create_mirror_view_and_copy(HostSpace(), h16);
        std::vector<float> v(m.extent(0));
        for (size_t i = 0; i < v.size(); ++i) v[i] = widen16(dt, m(i));
        return v;
      };
      const auto c = host(c32, c16), aux = host(aux32, aux16);
      const double ulp = dt == DType::F32 ? 1.2e-7 : dt == DType::BF16 ? 7.9e-3 : 9.8e-4;
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          double z = 0, mag = 0;
          for (std::int64_t k = 0; k < K; ++k) {
            z += 0.5 * a[i * K + k] * b[j * K + k];
            mag += std::fabs(0.5 * a[i * K + k] * b[j * K + k]);
          }
          const double t = z + (ep == Epilogue::None ? 0.0 : bias[j]);
          const double gelu = 0.5 * t * (1.0 + std::tanh(0.7978845608028654 * (t + 0.044715 * t * t * t)));
          const double want = ep == Epilogue::GeluAuxBias ? gelu : t;
          // one rounding of the output, plus fp32 accumulation (K terms) and the tanh form's own error
          const double tol = ulp * std::fabs(want) + 1e-6 * (mag + std::fabs(bias[j])) + 1e-6;
          ASSERT_NEAR(c[i * ldc + j], want, tol)
              << dtype_name(dt) << " " << epilogue_name(ep) << " (" << i << ", " << j << ")";
          if (ep == Epilogue::GeluAuxBias)
            ASSERT_NEAR(aux[i * ldc + j], t, ulp * std::fabs(t) + 1e-6 * (mag + std::fabs(bias[j])) + 1e-6)
                << dtype_name(dt) << " aux (" << i << ", " << j << ")";
        }
    }
}

// The batched bf16 GEMM at two threads against the same products one by one through gemm_bf16
// on one thread, compared as bytes: attention's layout (heads side by side in rows, stride = head
// size) and a contiguous odd-sized batch, every transpose pair, beta 0 and 1. (oneDNN's own
// batched matmul, one 3-D primitive, fails this: at 37 x 29 x 53 some elements differ by an ulp.)
TEST(Gemm, Bf16BatchedGivesTheBitsOfOneThreadProducts) {
  struct Case {
    std::int64_t M, N, K, batch;
    bool interleaved;  // matrices side by side in the rows of one buffer (attention's heads)
  };
  int checked = 0;
  for (const Case& c : {Case{64, 64, 64, 12, true}, Case{37, 29, 53, 5, false}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.f, 1.f}) {
          const float alpha = beta == 0.f ? 0.125f : 1.f;
          const std::int64_t ar = ta ? c.K : c.M, ac = ta ? c.M : c.K, br = tb ? c.N : c.K, bc = tb ? c.K : c.N;
          // interleaved: batch matrices of ac columns in rows of batch * ac (+ 3 spare) values
          const std::int64_t lda = c.interleaved ? c.batch * ac + 3 : ac + 1, sA = c.interleaved ? ac : ar * lda;
          const std::int64_t ldb = c.interleaved ? c.batch * bc + 3 : bc + 2, sB = c.interleaved ? bc : br * ldb;
          const std::int64_t ldc = c.N + 1, sC = c.M * ldc;
          const std::int64_t nA = c.interleaved ? ar * lda : c.batch * sA, nB = c.interleaved ? br * ldb : c.batch * sB;
          const auto fa = random_vector(nA, 21), fb = random_vector(nB, 22), fc = random_vector(c.batch * sC, 23);
          std::vector<std::uint16_t> hA(fa.size()), hB(fb.size());
          for (size_t i = 0; i < fa.size(); ++i) hA[i] = float_to_bf16(fa[i]);
          for (size_t i = 0; i < fb.size(); ++i) hB[i] = float_to_bf16(fb[i]);
          const auto dA = to_device(hA), dB = to_device(hB);
          auto batched = to_device(fc), single = to_device(fc);
          const Trans TA = ta ? Trans::T : Trans::N, TB = tb ? Trans::T : Trans::N;
          at_threads(2, [&] {
            gemm_bf16_strided_batched(TA, TB, c.M, c.N, c.K, alpha, dA.data(), lda, sA, dB.data(), ldb, sB, beta,
                                      batched.data(), ldc, sC, c.batch);
          });
          at_threads(1, [&] {
            for (std::int64_t b = 0; b < c.batch; ++b)
              gemm_bf16(TA, TB, c.M, c.N, c.K, alpha, dA.data() + b * sA, lda, dB.data() + b * sB, ldb, beta,
                        single.data() + b * sC, ldc);
          });
          const auto got = to_host(batched), want = to_host(single);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_EQ(float_bits(got[i]), float_bits(want[i]))
                << "M " << c.M << " N " << c.N << " K " << c.K << " batch " << c.batch << " ta " << ta << " tb " << tb
                << " beta " << beta << " element " << i << ": " << got[i] << " against " << want[i];
          // the products really ran: an element of the last matrix moved from its initial value
          ASSERT_NE(float_bits(got[(c.batch - 1) * sC]), float_bits(fc[(c.batch - 1) * sC]));
          ++checked;
        }
  EXPECT_EQ(checked, 16);
}

// A large fp32 GEMM at 2 threads is cut into one slab of C per thread (ops/gemm.cpp: by columns
// when op(B) is transposed, otherwise by rows), each slab computed by oneDNN on one thread: the
// result is, compared as bytes, the one-thread product's where oneDNN runs its AVX-512 kernels and
// the one-thread slabs' on AVX2 CPUs, for every transpose pair, beta 0 and 1, and slab edges away
// from the middle (600 rows split at 288, 1030 at 512, 771 columns at 384). oneDNN's own 2-thread
// split of 100 x 1000 x 1000 (NT) differs from its 1-thread result in some elements (measured
// with oneDNN 2.6 on Zen 5), so that case fails without the slabs.
TEST(Gemm, LargeProductsAtTwoThreadsGiveTheBitsOfOneThread) {
  struct Case {
    std::int64_t M, N, K;
    Trans ta, tb;
  };
  // Where oneDNN runs its AVX-512 kernels (proxy: it has a bf16 matmul) a cut keeps the bits of the
  // whole product; its AVX2 kernels choose their blocking by size, so there the reference is the
  // two slabs, each computed on one thread.
#if defined(TRIDENT_ENABLE_CUDA)
  const bool avx512 = true;  // cuBLAS: host threads play no part
#else
  const bool avx512 = gemm_bf16_native();
#endif
  const Case cases[] = {{100, 1000, 1000, Trans::N, Trans::T}, {100, 1000, 1000, Trans::T, Trans::T},
                        {256, 771, 512, Trans::N, Trans::T},   {600, 300, 500, Trans::N, Trans::N},
                        {600, 300, 500, Trans::T, Trans::N},   {1030, 260, 300, Trans::T, Trans::N}};
  for (const Case& c : cases)
    for (float beta : {0.f, 1.f}) {
      const bool at = c.ta == Trans::T, bt = c.tb == Trans::T;
      const std::int64_t lda = (at ? c.M : c.K) + 1, ldb = (bt ? c.K : c.N) + 3, ldc = c.N + 2;
      const auto A = random_vector((at ? c.K : c.M) * lda, 31), B = random_vector((bt ? c.N : c.K) * ldb, 32),
                 C = random_vector(c.M * ldc, 33);
      const auto dA = to_device(A), dB = to_device(B);
      auto two = to_device(C), one = to_device(C);
      at_threads(2,
                 [&] { gemm(c.ta, c.tb, c.M, c.N, c.K, 0.5f, dA.data(), lda, dB.data(), ldb, beta, two.data(), ldc); });
      if (avx512) {  // the whole product on one thread
        at_threads(1, [&] {
          gemm(c.ta, c.tb, c.M, c.N, c.K, 0.5f, dA.data(), lda, dB.data(), ldb, beta, one.data(), ldc);
        });
      } else {  // its two slabs (ops/gemm.cpp: by columns when op(B) is transposed), each on one thread
        const bool cols = bt;
        const std::int64_t extent = cols ? c.N : c.M, edge = extent / 2 / 16 * 16;
        at_threads(1, [&] {
          for (const auto& [lo, hi] : {std::pair{std::int64_t{0}, edge}, std::pair{edge, extent}}) {
            const float* a = cols ? dA.data() : dA.data() + (at ? lo : lo * lda);
            const float* b = cols ? dB.data() + (bt ? lo * ldb : lo) : dB.data();
            float* o = cols ? one.data() + lo : one.data() + lo * ldc;
            gemm(c.ta, c.tb, cols ? c.M : hi - lo, cols ? hi - lo : c.N, c.K, 0.5f, a, lda, b, ldb, beta, o, ldc);
          }
        });
      }
      const auto got = to_host(two), want = to_host(one);
      for (std::int64_t i = 0; i < c.M; ++i)
        for (std::int64_t j = 0; j < c.N; ++j)
          ASSERT_EQ(float_bits(got[i * ldc + j]), float_bits(want[i * ldc + j]))
              << c.M << " x " << c.N << " x " << c.K << (at ? " T" : " N") << (bt ? "T" : "N") << " beta " << beta
              << " element (" << i << ", " << j << "): " << got[i * ldc + j] << " against " << want[i * ldc + j];
      // the padding between rows is left alone
      for (std::int64_t i = 0; i < c.M; ++i)
        for (std::int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(float_bits(got[i * ldc + j]), float_bits(C[i * ldc + j]));
    }
}

#if !defined(TRIDENT_ENABLE_CUDA)
// The widened bf16 path (what gemm_bf16 runs where oneDNN has no bf16 matmul, ops/gemm.cpp), on
// every machine: each product has the bytes of the fp32 GEMM of the widened operands, chunk by
// chunk, at 1 and 2 threads, with the larger operand widened whole (the first two shapes) or cut
// into chunks (4.5 M values of op(B) in the third, 4.3 M of op(A) in the fourth), every transpose
// pair, beta 0 and 1, padded strides.
TEST(Gemm, WidenedBf16IsTheFp32GemmOfTheWidenedOperands) {
  struct Case {
    std::int64_t M, N, K;
  };
  int checked = 0;
  for (const Case& c : {Case{9, 13, 67}, Case{256, 771, 512}, Case{16, 70001, 64}, Case{67001, 24, 64}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const std::int64_t lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 2, ldc = c.N + 1;
        const auto fa = random_vector((ta ? c.K : c.M) * lda, 41), fb = random_vector((tb ? c.N : c.K) * ldb, 42);
        std::vector<std::uint16_t> hA(fa.size()), hB(fb.size());
        std::vector<float> wa(fa.size()), wb(fb.size());
        for (size_t i = 0; i < fa.size(); ++i) wa[i] = bf16_to_float(hA[i] = float_to_bf16(fa[i]));
        for (size_t i = 0; i < fb.size(); ++i) wb[i] = bf16_to_float(hB[i] = float_to_bf16(fb[i]));
        const auto dA = to_device(hA), dB = to_device(hB);
        const auto dwa = to_device(wa), dwb = to_device(wb);
        const Trans TA = ta ? Trans::T : Trans::N, TB = tb ? Trans::T : Trans::N;
        for (float beta : {0.f, 1.f}) {
          const auto init = random_vector(c.M * ldc, 43);
          for (int threads : {1, 2}) {
            // the reference: gemm() over the chunks (gemm.hpp: op(B)'s columns when N >= M, else
            // op(A)'s rows, floor(4 Mi / K / 16) * 16 at a time once that operand exceeds 4 Mi
            // values), at one thread where a cut keeps the bits (AVX-512 kernels), else at the
            // same thread count (AVX2 kernels: a cut of the product into slabs may change them)
            const bool cut_b = c.N >= c.M;
            const std::int64_t extent = cut_b ? c.N : c.M;
            const std::int64_t step = extent * c.K <= (std::int64_t{1} << 22) ? extent
                                                                              : (std::int64_t{1} << 22) / c.K / 16 * 16;
            auto want = to_device(init);
            at_threads(gemm_bf16_native() ? 1 : threads, [&] {
              for (std::int64_t lo = 0; lo < extent; lo += step) {
                const std::int64_t n = std::min(step, extent - lo);
                const float* a = cut_b ? dwa.data() : dwa.data() + (ta ? lo : lo * lda);
                const float* b = cut_b ? dwb.data() + (tb ? lo * ldb : lo) : dwb.data();
                float* o = cut_b ? want.data() + lo : want.data() + lo * ldc;
                gemm(TA, TB, cut_b ? c.M : n, cut_b ? n : c.N, c.K, 0.5f, a, lda, b, ldb, beta, o, ldc);
              }
            });
            const auto w = to_host(want);
            auto got = to_device(init);
            at_threads(threads, [&] {
              gemm_bf16_widened(TA, TB, c.M, c.N, c.K, 0.5f, dA.data(), lda, dB.data(), ldb, beta, got.data(), ldc);
            });
            const auto g = to_host(got);
            ASSERT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float)))
                << c.M << " x " << c.N << " x " << c.K << (ta ? " T" : " N") << (tb ? "T" : "N") << " beta " << beta
                << " threads " << threads;
            ++checked;
          }
        }
      }
  EXPECT_EQ(checked, 64);
}

// gemm_bf16 uses oneDNN's bf16 matmul exactly where oneDNN 2.6 has one: a CPU with AVX-512 (F, BW,
// VL and DQ: oneDNN's avx512_core) that ONEDNN_MAX_CPU_ISA does not limit below it; elsewhere it
// widens, and the GEMM line of the apps' banner says which. The suite runs this test again under
// ONEDNN_MAX_CPU_ISA=AVX2 (unit_bf16_avx2_*), where it must widen.
TEST(Gemm, Bf16PathIsTheOneThisCpuHas) {
  const std::string name = gemm_backend_name();
#if defined(TRIDENT_GEMM_DNNL)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  std::string isa;
  for (const char* var : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
    if (const char* v = std::getenv(var); v && isa.empty()) isa = v;
  for (char& ch : isa) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const bool limited = isa == "SSE41" || isa == "AVX" || isa == "AVX2" || isa == "AVX2_VNNI";
  EXPECT_EQ(gemm_bf16_native(), avx512 && !limited) << name << " (ONEDNN_MAX_CPU_ISA=" << isa << ")";
#else
  EXPECT_FALSE(gemm_bf16_native()) << name;
#endif
  EXPECT_NE(name.find(gemm_bf16_native() ? "bf16: oneDNN bf16 matmul" : "bf16: widened to fp32"), std::string::npos)
      << name;
}
#endif

TEST(LayerNorm, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const std::int64_t N = 3, C = 8;
  const float eps = 1e-5f;
  auto x = random_vector(N * C, 10, 2.f), w = random_vector(C, 11), b = random_vector(C, 12),
       R = random_vector(N * C, 13);
  auto run = [&](std::vector<float>* dx, std::vector<float>* dw, std::vector<float>* db) {
    auto dxv = to_device(x), dwv = to_device(w), dbv = to_device(b);
    FloatView out = make_float("o", N * C), mean = make_float("m", N), rstd = make_float("r", N);
    layernorm_forward(out, mean, rstd, dxv, dwv, dbv, N, C, eps);
    auto o = to_host(out);
    if (dx) {
      FloatView gx = make_float("gx", N * C), gw = make_float("gw", C), gb = make_float("gb", C);
      layernorm_backward(gx, gw, gb, to_device(R), dxv, dwv, mean, rstd, N, C);
      *dx = to_host(gx);
      *dw = to_host(gw);
      *db = to_host(gb);
    }
    return o;
  };
  auto out = run(nullptr, nullptr, nullptr);
  std::vector<double> want(N * C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    for (int c = 0; c < C; ++c) want[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + eps) * w[c] + b[c];
  }
  expect_close(as_double(out), want, kFwdRtol, kFwdAtol, "layernorm forward");
  std::vector<float> gx, gw, gb;
  run(&gx, &gw, &gb);
  auto loss = [&] { return dot(run(nullptr, nullptr, nullptr), R); };
  std::vector<size_t> all_x(N * C), all_c(C);
  for (size_t i = 0; i < all_x.size(); ++i) all_x[i] = i;
  for (size_t i = 0; i < all_c.size(); ++i) all_c[i] = i;
  expect_close(as_double(gx), numeric_gradient(x, loss, all_x), kGradRtol, kGradAtol, "layernorm dx");
  expect_close(as_double(gw), numeric_gradient(w, loss, all_c), kGradRtol, kGradAtol, "layernorm dw");
  expect_close(as_double(gb), numeric_gradient(b, loss, all_c), kGradRtol, kGradAtol, "layernorm db");
}

TEST(Gelu, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  const std::int64_t n = 64;
  auto x = random_vector(n, 20, 2.f), R = random_vector(n, 21);
  auto fwd = [&] {
    FloatView o = make_float("o", n);
    gelu_forward(o, to_device(x), n);
    return to_host(o);
  };
  auto out = fwd();
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) {
    const double v = x[i];
    want[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  expect_close(as_double(out), want, kFwdRtol, kFwdAtol, "gelu forward");
  FloatView gx = make_float("gx", n);
  gelu_backward(gx, to_device(R), to_device(x), n);
  std::vector<size_t> idx(n);
  for (int i = 0; i < n; ++i) idx[i] = i;
  expect_close(as_double(to_host(gx)),
               numeric_gradient(
                   x, [&] { return dot(fwd(), R); }, idx),
               kGradRtol, kGradAtol, "gelu dx");
}

TEST(Attention, CausalForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const AttentionShape s{2, 5, 8, 2};  // B, T, C, nh
  const std::int64_t BT = s.B * s.T;
  auto qkv = random_vector(BT * 3 * s.C, 30), R = random_vector(BT * s.C, 31);
  FloatView att = make_float("att", s.B * s.nh * s.T * s.T), y = make_float("y", BT * s.C);
  FloatView dqkv_in;  // the qkv the last forward saw (backward reads it)
  auto fwd = [&] {
    dqkv_in = to_device(qkv);
    attention_forward(y, dqkv_in, att, s);
    return to_host(y);
  };
  auto out = fwd();
  const std::vector<double> want = reference_attention(qkv, s.B, s.T, s.C, s.nh, true);
  expect_close(as_double(out), want, kFwdRtol, kFwdAtol, "attention forward");
  // backward
  fwd();
  FloatView dqkv = make_float("dqkv", BT * 3 * s.C), datt = make_float("datt", s.B * s.nh * s.T * s.T);
  attention_backward(dqkv, to_device(R), dqkv_in, att, Act(), datt, s);
  auto g = to_host(dqkv);
  auto idx = sample_indices(qkv.size(), 60, 7);
  expect_close(pick(g, idx),
               numeric_gradient(
                   qkv, [&] { return dot(fwd(), R); }, idx),
               kGradRtol, kGradAtol, "attention dqkv");
}

// T5's cross-attention: queries of one sequence (T) over keys and values of another (Tk), with
// the key sequence's padding mask; forward against a naive double-precision reference, the
// gradients of q and of k|v against finite differences, and the bf16 twin against fp32 on the
// rounded inputs.
// The 16-bit path's softmax kernels (one each on a device) against the sequences they replace,
// compared as bits: forward (softmax, rounding, dropout, rounding) and backward (dropout backward,
// the stored probabilities widened, softmax backward, rounding); causal and not, with and without
// dropout, bf16 and fp16; rows of 9 keys and of 16 (the device kernels' 16-byte groups).
TEST(Attention, HalfSoftmaxKernelsGiveTheBitsOfTheirSequences) {
  for (const std::int64_t T : {9, 16}) {
    const std::int64_t B = 2, nh = 3, BH = B * nh, A = BH * T * T;
    const float scale = 0.35f;
    auto words = [](const HalfView& h) {
      auto m = Kokkos::create_mirror_view_and_copy(HostSpace(), h);
      return std::vector<std::uint16_t>(m.data(), m.data() + m.extent(0));
    };
    int checked = 0;
    for (DType dt : {DType::BF16, DType::F16})
      for (bool causal : {true, false})
        for (const DropoutSpec& drop : {DropoutSpec{0.2f, 99}, DropoutSpec{}}) {
          AttentionMask mask;
          mask.causal = causal;
          const auto scores = random_vector(A, 60, 4.f), grad = random_vector(A, 61);
          // forward
          FloatView seq = to_device(scores), fused_scratch = to_device(scores);
          HalfView att_seq = make_half("a", A), drop_seq = make_half("d", A), att = make_half("a2", A),
                   att_drop = make_half("d2", A);
          masked_softmax_forward(seq, BH, T, T, nh, scale, mask);
          pack_half(dt, att_seq, seq, A);
          if (drop.active()) {
            dropout_forward(seq, seq, A, drop);
            pack_half(dt, drop_seq, seq, A);
          }
          masked_softmax_forward_half(dt, fused_scratch, att, att_drop, BH, T, T, nh, scale, mask, drop);
          ASSERT_EQ(words(att), words(att_seq))
              << dtype_name(dt) << " T " << T << " causal " << causal << " p " << drop.p;
          if (drop.active()) ASSERT_EQ(words(att_drop), words(drop_seq)) << dtype_name(dt) << " causal " << causal;
          // backward, from the stored probabilities
          FloatView dseq = to_device(grad), dfused = to_device(grad), att32 = make_float("att32", A);
          HalfView ds_seq = make_half("ds", A), ds = make_half("ds2", A);
          if (drop.active()) dropout_backward(dseq, dseq, A, drop);
          unpack_half(dt, att32, att_seq, A);
          masked_softmax_backward(dseq, att32, BH, T, T, scale, causal);
          pack_half(dt, ds_seq, dseq, A);
          masked_softmax_backward_half(dt, dfused, att, ds, BH, T, T, scale, causal, drop);
          ASSERT_EQ(words(ds), words(ds_seq)) << dtype_name(dt) << " causal " << causal << " p " << drop.p;
          ++checked;
        }
    EXPECT_EQ(checked, 8);
  }
}

TEST(Attention, CrossAttentionWithKeyPaddingMatchesNaiveAndFiniteDifferences) {
  AttentionShape s{2, 3, 8, 2};  // B, T (queries), C, nh
  s.Tk = 5;
  const std::int64_t B = s.B, T = s.T, Tk = s.Tk, C = s.C, hs = s.hs(), A = B * s.nh * T * Tk;
  auto q = random_vector(B * T * C, 60), kv = random_vector(B * Tk * 2 * C, 61), R = random_vector(B * T * C, 62);
  const std::vector<std::int32_t> valid = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1};  // sample 0: 3 keys, sample 1: 5
  const IntView dvalid = to_device(valid);
  const AttentionMask mask{false, dvalid};
  FloatView att = make_float("att", A), y = make_float("y", B * T * C), dq_in, dkv_in;
  auto fwd = [&] {
    dq_in = to_device(q);
    dkv_in = to_device(kv);
    cross_attention_probs(att, FloatView(), dq_in, dkv_in, s, {}, mask);
    cross_attention_context(y, att, dkv_in, s);
    return to_host(y);
  };
  auto out = fwd();
  std::vector<double> want(B * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < s.nh; ++h)
      for (int i = 0; i < T; ++i) {
        std::vector<double> sc(Tk, 0.0);
        double mx = -1e300, z = 0;
        for (int j = 0; j < Tk; ++j) {
          if (!valid[b * Tk + j]) continue;
          double d = 0;
          for (int e = 0; e < hs; ++e)
            d += static_cast<double>(q[(b * T + i) * C + h * hs + e]) * kv[(b * Tk + j) * 2 * C + h * hs + e];
          sc[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, sc[j]);
        }
        for (int j = 0; j < Tk; ++j) z += valid[b * Tk + j] ? (sc[j] = std::exp(sc[j] - mx)) : (sc[j] = 0.0);
        for (int e = 0; e < hs; ++e) {
          double acc = 0;
          for (int j = 0; j < Tk; ++j) acc += sc[j] / z * kv[(b * Tk + j) * 2 * C + C + h * hs + e];
          want[(b * T + i) * C + h * hs + e] = acc;
        }
      }
  expect_close(as_double(out), want, kFwdRtol, kFwdAtol, "cross-attention forward");
  fwd();
  FloatView dq = make_float("dq", B * T * C), dkv = make_float("dkv", B * Tk * 2 * C), datt = make_float("datt", A);
  cross_attention_backward(dq, dkv, to_device(R), dq_in, dkv_in, att, Act(), datt, s, {}, mask);
  auto gq = to_host(dq), gkv = to_host(dkv);
  auto iq = sample_indices(q.size(), 40, 8), ikv = sample_indices(kv.size(), 60, 9);
  expect_close(pick(gq, iq),
               numeric_gradient(
                   q, [&] { return dot(fwd(), R); }, iq),
               kGradRtol, kGradAtol, "cross-attention dq");
  expect_close(pick(gkv, ikv),
               numeric_gradient(
                   kv, [&] { return dot(fwd(), R); }, ikv),
               kGradRtol, kGradAtol, "cross-attention dkv");
  for (int b = 0; b < B; ++b)  // padded keys get no gradient
    for (int j = 0; j < Tk; ++j)
      if (!valid[b * Tk + j])
        for (int e = 0; e < 2 * C; ++e) EXPECT_EQ(gkv[(b * Tk + j) * 2 * C + e], 0.f);
  // bf16: 16-bit operands and probabilities, fp32 accumulation; against fp32 on the rounded inputs
  for (auto& v : q) v = round_to(DType::BF16, v);
  for (auto& v : kv) v = round_to(DType::BF16, v);
  const auto ref = fwd();
  HalfView q16 = make_half("q16", B * T * C), kv16 = make_half("kv16", B * Tk * 2 * C), att16 = make_half("att16", A),
           y16 = make_half("y16", B * T * C);
  pack_half(DType::BF16, q16, to_device(q), B * T * C);
  pack_half(DType::BF16, kv16, to_device(kv), B * Tk * 2 * C);
  FloatView scores = make_float("scores", A), y32 = make_float("y32", B * T * C);
  AttentionScratch scratch;
  scratch.scores = scores;
  scratch.y32 = y32;
  const Act att_b(DType::BF16, att16), q_b(DType::BF16, q16), kv_b(DType::BF16, kv16), y_b(DType::BF16, y16);
  cross_attention_probs(att_b, Act(), q_b, kv_b, s, {}, mask, scratch);
  cross_attention_context(y_b, att_b, kv_b, s, scratch);
  FloatView yw = make_float("yw", B * T * C);
  unpack_half(DType::BF16, yw, y16, B * T * C);
  expect_close(as_double(to_host(yw)), as_double(ref), 8e-3, 4e-3, "cross-attention bf16 forward");  // ~2 bf16 ulps
}

TEST(CrossEntropy, PaddedColumnsNeverMatterAndGradientMatchesFiniteDifferences) {
  const std::int64_t N = 4, V = 11, Vp = 16;
  auto logits = random_vector(N * Vp, 40, 3.f);
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) logits[n * Vp + j] = 1e4f;  // padding: must be ignored
  std::vector<std::int32_t> tgt = {0, 10, 3, 7};
  auto dt = to_device(tgt);
  auto fwd = [&] {
    FloatView l = make_float("l", N);
    cross_entropy_forward(l, to_device(logits), dt, N, V, Vp);
    return sum_losses(l, N);
  };
  double want = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[n * Vp + j]));
    for (int j = 0; j < V; ++j) z += std::exp(logits[n * Vp + j] - mx);
    want += mx + std::log(z) - logits[n * Vp + tgt[n]];
  }
  EXPECT_NEAR(fwd(), want, 1e-5 * std::fabs(want));
  const float dscale = 0.25f;
  auto dl = to_device(logits);
  FloatView l = make_float("l", N);
  cross_entropy_forward_backward(l, dl, dt, N, V, Vp, dscale);
  auto g = to_host(dl);
  std::vector<size_t> idx;
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < V; ++j) idx.push_back(n * Vp + j);
  auto num = numeric_gradient(
      logits, [&] { return dscale * fwd(); }, idx);
  expect_close(pick(g, idx), num, kGradRtol, kGradAtol, "cross-entropy dlogits");
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) EXPECT_EQ(g[n * Vp + j], 0.f);
}

// The device path's 16-bit classifier: from logits held in 16 bits, the losses of the fp32 kernel
// on the same values, and the gradient that kernel computes rounded once into the logits' words
// (bitwise; bf16 and fp16, an ignored position, padded columns). A host build refuses it.
TEST(CrossEntropy, SixteenBitClassifierGivesTheFp32KernelsLossAndRoundedGradient) {
  const std::int64_t N = 5, V = 45, Vp = 48;
  const std::vector<std::int32_t> tgt = {0, 44, -1, 7, 20};
  for (const DType dt : {DType::BF16, DType::F16}) {
    auto logits = random_vector(N * Vp, 41, 4.f);
    const Act h = to_half(dt, logits);  // logits now the 16-bit values
    FloatView l16 = make_float("l16", N), scratch = make_float("scratch", 3 * N);
    if constexpr (!kDeviceKernels) {
      EXPECT_THROW(token_cross_entropy_half(dt, l16, h.h, to_device(tgt), N, V, Vp, 0, 0.5f, true, nullptr, scratch),
                   Error);
      continue;
    }
    token_cross_entropy_half(dt, l16, h.h, to_device(tgt), N, V, Vp, 0, 0.5f, true, nullptr, scratch);
    FloatView l32 = make_float("l32", N), g32 = to_device(logits);
    token_cross_entropy(l32, g32, to_device(tgt), N, V, Vp, 0, 0.5f, true, nullptr, scratch);
    EXPECT_EQ(to_host(l16), to_host(l32)) << dtype_name(dt);
    const auto g = to_host(g32);
    const auto w = words(h);
    for (std::int64_t i = 0; i < N * Vp; ++i) ASSERT_EQ(w[i], round16(dt, g[i])) << dtype_name(dt) << " " << i;
    // forward only: the losses, the logits untouched
    Act h2 = to_half(dt, logits);
    token_cross_entropy_half(dt, l16, h2.h, to_device(tgt), N, V, Vp, 0, 0.f, false, nullptr, scratch);
    EXPECT_EQ(to_host(l16), to_host(l32)) << dtype_name(dt);
    EXPECT_EQ(words(h2), words(to_half(dt, logits)));
  }
}

TEST(Embedding, ForwardAndScatterBackward) {
  const std::int64_t B = 2, T = 3, C = 4, V = 5;
  auto wte = random_vector(V * C, 50), wpe = random_vector(T * C, 51), R = random_vector(B * T * C, 52);
  std::vector<std::int32_t> tok = {1, 4, 1, 0, 1, 3};  // repeated token 1
  auto dtok = to_device(tok);
  auto fwd = [&] {
    FloatView o = make_float("o", B * T * C);
    embedding_forward(o, dtok, to_device(wte), to_device(wpe), B, T, C);
    return to_host(o);
  };
  auto out = fwd();
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) EXPECT_FLOAT_EQ(out[bt * C + c], wte[tok[bt] * C + c] + wpe[(bt % T) * C + c]);
  FloatView gte = make_float("gte", V * C), gpe = make_float("gpe", T * C);
  embedding_backward(gte, gpe, to_device(R), dtok, B, T, C);
  std::vector<size_t> all_te(V * C), all_pe(T * C);
  for (size_t i = 0; i < all_te.size(); ++i) all_te[i] = i;
  for (size_t i = 0; i < all_pe.size(); ++i) all_pe[i] = i;
  auto loss = [&] { return dot(fwd(), R); };
  expect_close(as_double(to_host(gte)), numeric_gradient(wte, loss, all_te), kGradRtol, kGradAtol, "dwte");
  expect_close(as_double(to_host(gpe)), numeric_gradient(wpe, loss, all_pe), kGradRtol, kGradAtol, "dwpe");
}

// The embedding backward adds each table row's contributions in row order on every backend: with
// the rows' order by token (and by position) that a device build's kernels walk, and without, the
// gradient (starting from non-zero values) has the bits of the plain loop below. Vocabulary-parallel
// (rows [4, 10) of 13), positions given and as row % T, a sequence-parallel slice of the rows.
TEST(Embedding, BackwardAddsEachRowsContributionsInRowOrder) {
  const std::int64_t N = 240, T = 24, C = 5, V = 13, start = 4, local = 6, row0 = 48, R = 96;
  std::vector<std::int32_t> tok(N), pos(N);
  for (std::int64_t n = 0; n < N; ++n) {
    tok[n] = static_cast<std::int32_t>((n * 7 + n / 5) % V);
    pos[n] = static_cast<std::int32_t>((n * 5) % T);
  }
  auto order_of = [&](const std::vector<std::int32_t>& key) {
    std::vector<std::int32_t> o(key.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<std::int32_t>(i);
    std::stable_sort(o.begin(), o.end(), [&](std::int32_t a, std::int32_t b) { return key[a] < key[b]; });
    return o;
  };
  const auto dout = random_vector(N * C, 53), g0 = random_vector(V * C, 54), p0 = random_vector(T * C, 55);
  std::vector<float> want_te(g0.begin(), g0.begin() + local * C), want_pe(p0), want_pe_mod(p0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      if (tok[n] >= start && tok[n] < start + local) want_te[(tok[n] - start) * C + c] += dout[n * C + c];
  for (std::int64_t i = 0; i < R; ++i)
    for (std::int64_t c = 0; c < C; ++c) {
      want_pe[pos[row0 + i] * C + c] += dout[i * C + c];
      want_pe_mod[((row0 + i) % T) * C + c] += dout[i * C + c];
    }
  const auto ddout = to_device(dout);
  const IntView dtok = to_device(tok), dpos = to_device(pos);
  auto same_bits = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << what << " element " << i;
  };
  for (bool ordered : {true, false}) {
    const IntView tok_order = ordered ? to_device(order_of(tok)) : IntView();
    const IntView pos_order = ordered ? to_device(order_of(pos)) : IntView();
    auto gte = to_device(std::vector<float>(g0.begin(), g0.begin() + local * C));
    embedding_lookup_backward(gte, ddout, dtok, start, local, N, C, tok_order);
    same_bits(to_host(gte), want_te, ordered ? "dwte, ordered" : "dwte");
    auto gpe = to_device(p0);
    add_positions_backward(gpe, ddout, row0, R, T, C, dpos, pos_order);
    same_bits(to_host(gpe), want_pe, ordered ? "dwpe, ordered" : "dwpe");
    auto gpm = to_device(p0);
    add_positions_backward(gpm, ddout, row0, R, T, C);
    same_bits(to_host(gpm), want_pe_mod, "dwpe, row % T");
  }
}

TEST(Elementwise, BiasNormAndNonFinite) {
  auto y = random_vector(6, 60), bias = random_vector(3, 61);
  auto dy = to_device(y);
  add_bias(dy, to_device(bias), 2, 3);
  auto out = to_host(dy);
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(out[i], y[i] + bias[i % 3]);
  FloatView db = make_float("db", 3);
  bias_backward(db, to_device(y), 2, 3);
  auto g = to_host(db);
  for (int c = 0; c < 3; ++c) EXPECT_FLOAT_EQ(g[c], y[c] + y[3 + c]);
  double ss = 0;
  for (float v : y) ss += static_cast<double>(v) * v;
  EXPECT_NEAR(sum_squares(to_device(y), 6), ss, 1e-6 * ss);
  EXPECT_FALSE(has_nonfinite(to_device(y), 6));
  y[4] = std::nanf("");
  EXPECT_TRUE(has_nonfinite(to_device(y), 6));
  y[4] = INFINITY;
  EXPECT_TRUE(has_nonfinite(to_device(y), 6));
}
