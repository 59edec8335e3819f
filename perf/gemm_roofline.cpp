// gemm_roofline: the machine's fp32 GEMM rate through Trident's own ops/gemm (oneDNN sgemm on the
// host, cuBLAS on CUDA builds), for exactly the GEMMs of one GPT training step, and for a large
// square GEMM (the peak).
//
//   gemm_roofline [--tokens 256] [--seq 64] [--hidden 384,768] [--head-dim 64] [--vocab 50304]
//                 [--ffn 0] [--groups 0] [--swiglu] [--square 2048] [--min-time 0.25] [--json FILE]
//                 [--stream-mib 0]
//
// Host threads: the GEMM library's (OMP_NUM_THREADS for oneDNN).
//
// --stream-mib M (> 0) also measures the memory bandwidth the host kernels see, over fp32 arrays
// of M MiB each, launched as Trident's host kernels are (common/host_parallel.hpp, the same
// threads), best of repetitions over --min-time: STREAM's triad a = b + s c and the in-place
// update a = a + s b, 12 bytes per element each. perf/bench_mixed.py prices the step's
// memory-bound floor (AdamW, the gradient norm: in-place sweeps) at the better of the two.
//
// One GPT step (fp32, no recomputation, tokens N = B*T, hidden C, ffn 4C, padded vocab V) runs,
// per layer, the forward GEMM, the input-gradient GEMM and the weight-gradient GEMM of the four
// linears (qkv C->3C, proj C->C, fc1 C->4C, fc2 4C->C) and the attention GEMMs (B*heads small
// T x T x head_dim products, forward and backward, timed as the model calls them: one batched call
// per product for the micro-batch, samples and query heads of a group as the outer level, the
// key/value groups inner), and once the tied LM head (N x V x C, forward
// and both gradients). Their FLOPs add up to Megatron's model FLOPs
// 72 B s l h^2 (1 + s/6h + V/12hl). The Llama family's layer (--ffn F, --groups ng, --swiglu) has
// qkv C -> (heads + 2 ng) head_dim, fc1 C -> 2F (gate and up), fc2 F -> C, the same per-head
// attention products, and an untied output layer whose GEMMs are the tied head's; their FLOPs add
// up to Megatron's general form 12 B s l h^2 ((1 + ng/nh + s/h) nh d/h + 3F/2h + V/2lh). The
// FLOP-weighted rate of this mix,
//     roofline = sum(count_i * flops_i) / sum(count_i * time_i),
// is what a step would reach if everything but the GEMMs took no time: the roofline that
// Trident's model FLOP/s is compared with. Each GEMM is timed per call (median of repetitions
// after warm-up) with the same transposes, leading dimensions and beta as the model uses, on
// operands that stay in cache between calls (an upper bound for the weights of a large model).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <utility>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/half.hpp"
#include "common/host_parallel.hpp"
#include "ops/gemm.hpp"
#include "runtime/app_driver.hpp"

namespace trident::perf {

using View = Kokkos::View<float*, Kokkos::LayoutRight>;

// Deterministic operands in [-0.5, 0.5) (outside the anonymous namespace: CUDA's extended
// lambdas need an enclosing function with external linkage).
void fill(const View& v, std::uint32_t seed) {
  Kokkos::parallel_for(
      "perf::fill", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(v.extent(0))), KOKKOS_LAMBDA(std::int64_t i) {
        std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u + seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        v(i) = static_cast<float>(x & 0xffff) / 65536.f - 0.5f;
      });
}

void to_bf16(const Kokkos::View<std::uint16_t*, Kokkos::LayoutRight>& h, const View& v) {
  Kokkos::parallel_for(
      "perf::to_bf16", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(v.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) { h(i) = trident::float_to_bf16(v(i)); });
}

}  // namespace trident::perf

namespace {

using trident::Trans;
using trident::perf::fill;
using trident::perf::to_bf16;
using trident::perf::View;

struct Options {
  std::int64_t tokens = 256, seq = 64, head_dim = 64, vocab = 50304, square = 2048;
  std::vector<std::int64_t> hidden{384, 768};
  std::vector<std::int64_t> ffn{0};     // per hidden size (one value: all); 0 = 4 C
  std::vector<std::int64_t> groups{0};  // key/value groups per hidden size; 0 = heads (multi-head)
  bool swiglu = false;                  // gated MLP: fc1 C -> 2F
  double min_time = 0.25;
  std::string json;
  bool bf16 = false;            // --dtype bf16: bf16 inputs, fp32 accumulation and output (trident::gemm_bf16)
  std::int64_t stream_mib = 0;  // > 0: the triad's arrays, MiB each
};

// One GEMM of the step: C[M,N] = op(A)[M,K] op(B)[K,N] (+ C when beta = 1), `batch` of them per
// call (strided), `count` calls per layer (or per step for the LM head, see per_layer). With
// `inner`, the call is gemm_mixed_batched over two levels, batch / inner outer products of `inner`
// each (attention's samples and heads over its key/value groups, as ops/attention.cpp calls it).
struct Shape {
  std::string name;
  Trans ta, tb;
  std::int64_t M, N, K, batch;
  float beta;
  bool per_layer;
  std::int64_t calls = 1;  // calls per layer (per step for the LM head)
  std::int64_t inner = 0;
  double median_s = 0, best_s = 0;
  int reps = 0;
  double flops() const { return 2.0 * static_cast<double>(M) * N * K * batch; }
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<std::int64_t> parse_list(const std::string& s) {
  std::vector<std::int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    TRIDENT_REQUIRE(!item.empty(), "gemm_roofline: bad list '" << s << "'");
    v.push_back(std::stoll(item));
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      TRIDENT_REQUIRE(i + 1 < argc, "gemm_roofline: " << a << " needs a value");
      return argv[++i];
    };
    if (a == "--tokens")
      o.tokens = std::stoll(value());
    else if (a == "--seq")
      o.seq = std::stoll(value());
    else if (a == "--head-dim")
      o.head_dim = std::stoll(value());
    else if (a == "--vocab")
      o.vocab = std::stoll(value());
    else if (a == "--square")
      o.square = std::stoll(value());
    else if (a == "--hidden")
      o.hidden = parse_list(value());
    else if (a == "--ffn")
      o.ffn = parse_list(value());
    else if (a == "--groups")
      o.groups = parse_list(value());
    else if (a == "--swiglu")
      o.swiglu = true;
    else if (a == "--min-time")
      o.min_time = std::stod(value());
    else if (a == "--json")
      o.json = value();
    else if (a == "--stream-mib")
      o.stream_mib = std::stoll(value());
    else if (a == "--dtype") {
      const std::string d = value();
      TRIDENT_REQUIRE(d == "fp32" || d == "bf16", "gemm_roofline: --dtype must be fp32 or bf16");
      o.bf16 = d == "bf16";
    } else if (a == "--help" || a == "-h") {
      std::cout
          << "gemm_roofline [--tokens N=256] [--seq T=64] [--hidden 384,768] [--head-dim 64] [--vocab 50304]\n"
             "              [--ffn F (0: 4C)] [--groups ng (0: heads)] [--swiglu]\n"
             "              [--square 2048 (0: skip)] [--min-time 0.25 s per shape] [--json FILE] [--dtype fp32|bf16]\n"
             "              [--stream-mib M (0: skip): memory bandwidth over arrays of M MiB]\n"
             "fp32 GEMM rate through Trident's ops/gemm for the GEMMs of one GPT step (B = N/T, heads = C/head-dim)\n"
             "and a square GEMM; --ffn and --groups take one value or one per --hidden; threads: OMP_NUM_THREADS (oneDNN).\n";
      std::exit(0);
    } else if (a.rfind("--kokkos", 0) == 0) {
      continue;  // Kokkos' own flags
    } else {
      throw trident::Error::all("gemm_roofline: unknown argument " + a + " (see --help)");
    }
  }
  TRIDENT_REQUIRE(o.tokens > 0 && o.seq > 0 && o.tokens % o.seq == 0,
                  "gemm_roofline: --tokens must be a positive multiple of --seq");
  for (auto c : o.hidden)
    TRIDENT_REQUIRE(c > 0 && c % o.head_dim == 0, "gemm_roofline: hidden " << c << " is not a multiple of --head-dim");
  TRIDENT_REQUIRE(o.min_time > 0, "gemm_roofline: --min-time must be > 0");
  for (auto* list : {&o.ffn, &o.groups}) {
    TRIDENT_REQUIRE(list->size() == 1 || list->size() == o.hidden.size(),
                    "gemm_roofline: --ffn and --groups take one value or one per --hidden size");
    if (list->size() == 1) list->assign(o.hidden.size(), list->front());
  }
  for (std::size_t i = 0; i < o.hidden.size(); ++i) {
    const std::int64_t heads = o.hidden[i] / o.head_dim, g = o.groups[i];
    TRIDENT_REQUIRE(o.ffn[i] >= 0, "gemm_roofline: --ffn must be >= 0");
    TRIDENT_REQUIRE(g >= 0 && (g == 0 || heads % g == 0), "gemm_roofline: --groups " << g << " does not divide the "
                                                                                     << heads << " heads of hidden "
                                                                                     << o.hidden[i]);
  }
  return o;
}

// The GEMMs of one step at hidden C (layer.cpp / attention.cpp / gpt_model.cpp call them so).
std::vector<Shape> step_shapes(const Options& o, std::size_t ci) {
  const std::int64_t C = o.hidden[ci];
  const std::int64_t N = o.tokens, T = o.seq, B = N / T, H = C / o.head_dim, hs = o.head_dim, V = o.vocab;
  const std::int64_t F = o.ffn[ci] > 0 ? o.ffn[ci] : 4 * C, G = o.groups[ci] > 0 ? o.groups[ci] : H;
  std::vector<Shape> v;
  auto linear = [&](const std::string& name, std::int64_t in, std::int64_t out) {
    v.push_back({name + " fwd   y=xW^T", Trans::N, Trans::T, N, out, in, 1, 0.f, true});
    v.push_back({name + " bwd   dx=dyW", Trans::N, Trans::N, N, in, out, 1, 0.f, true});
    v.push_back({name + " bwd   dW+=dy^Tx", Trans::T, Trans::N, out, in, N, 1, 1.f, true});
  };
  linear("qkv ", C, (H + 2 * G) * hs);  // [q; k groups; v groups]
  linear("proj", C, C);
  linear("fc1 ", C, o.swiglu ? 2 * F : F);  // SwiGLU: [gate; up]
  linear("fc2 ", F, C);
  // The per-head products as ops/attention.cpp calls them: one gemm_mixed_batched call per product
  // for the micro-batch, B H products over the samples and the H / G query heads of a group, each
  // a strided batch of the G key/value groups. The key and value gradients of a group sum over its
  // H / G query heads: H / G calls of B G products (beta 1 after the first).
  const std::int64_t rep = H / G;
  const float acc = rep > 1 ? 1.f : 0.f;
  v.push_back({"attn fwd   S=QK^T", Trans::N, Trans::T, T, T, hs, B * H, 0.f, true, 1, G});
  v.push_back({"attn fwd   Y=PV", Trans::N, Trans::N, T, hs, T, B * H, 0.f, true, 1, G});
  v.push_back({"attn bwd   dP=dYV^T", Trans::N, Trans::T, T, T, hs, B * H, 0.f, true, 1, G});
  v.push_back({"attn bwd   dV=P^TdY", Trans::T, Trans::N, T, hs, T, B * G, acc, true, rep, G});
  v.push_back({"attn bwd   dQ=dSK", Trans::N, Trans::N, T, hs, T, B * H, 0.f, true, 1, G});
  v.push_back({"attn bwd   dK=dS^TQ", Trans::T, Trans::N, T, hs, T, B * G, acc, true, rep, G});
  v.push_back({"lm head fwd   logits=xE^T", Trans::N, Trans::T, N, V, C, 1, 0.f, false});
  v.push_back({"lm head bwd   dx=dlogitsE", Trans::N, Trans::N, N, C, V, 1, 0.f, false});
  v.push_back({"lm head bwd   dE+=dlogits^Tx", Trans::T, Trans::N, V, C, N, 1, 1.f, false});
  return v;
}

// Times one shape: warm-up, then per-call times until min_time has passed (5..400 calls).
void time_shape(Shape& s, double min_time, bool bf16) {
  const std::int64_t rowsA = s.ta == Trans::N ? s.M : s.K, colsA = s.ta == Trans::N ? s.K : s.M;
  const std::int64_t rowsB = s.tb == Trans::N ? s.K : s.N, colsB = s.tb == Trans::N ? s.N : s.K;
  View A("perf::A", rowsA * colsA * s.batch), B("perf::B", rowsB * colsB * s.batch), C("perf::C", s.M * s.N * s.batch);
  fill(A, 1);
  fill(B, 2);
  Kokkos::deep_copy(C, 0.f);
  using Half = Kokkos::View<std::uint16_t*, Kokkos::LayoutRight>;
  Half hA, hB;
  if (bf16) {
    hA = Half("perf::A16", A.extent(0));
    hB = Half("perf::B16", B.extent(0));
    to_bf16(hA, A);
    to_bf16(hB, B);
  }
  Kokkos::fence();
  // the model's levels (outer products, then `inner`), contiguous
  const std::int64_t in = s.inner > 0 ? s.inner : 1, sa = rowsA * colsA, sb = rowsB * colsB, sc = s.M * s.N;
  const trident::GemmBatch levels{{{s.batch / in, in * sa, in * sb, in * sc}, {in, sa, sb, sc}}};
  auto call = [&] {
    if (s.inner > 0)
      trident::gemm_mixed_batched(s.ta, s.tb, s.M, s.N, s.K, 1.f,
                                  bf16 ? trident::operand(trident::DType::BF16, hA.data()) : trident::operand(A.data()),
                                  colsA,
                                  bf16 ? trident::operand(trident::DType::BF16, hB.data()) : trident::operand(B.data()),
                                  colsB, s.beta, C.data(), s.N, levels);
    else if (bf16 && s.batch == 1)
      trident::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.f, hA.data(), colsA, hB.data(), colsB, s.beta, C.data(), s.N);
    else if (bf16)
      trident::gemm_bf16_strided_batched(s.ta, s.tb, s.M, s.N, s.K, 1.f, hA.data(), colsA, rowsA * colsA, hB.data(),
                                         colsB, rowsB * colsB, s.beta, C.data(), s.N, s.M * s.N, s.batch);
    else if (s.batch == 1)
      trident::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), colsA, B.data(), colsB, s.beta, C.data(), s.N);
    else
      trident::gemm_strided_batched(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), colsA, rowsA * colsA, B.data(), colsB,
                                    rowsB * colsB, s.beta, C.data(), s.N, s.M * s.N, s.batch);
    Kokkos::fence();
  };
  for (int w = 0; w < 3; ++w) call();
  std::vector<double> t;
  const double t_start = now_s();
  while ((t.size() < 5 || now_s() - t_start < min_time) && t.size() < 400) {
    const double t0 = now_s();
    call();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  s.median_s = t[t.size() / 2];
  s.best_s = t.front();
  s.reps = static_cast<int>(t.size());
}

const char* tname(Trans t) { return t == Trans::N ? "N" : "T"; }

// Memory bandwidth through the host kernels' launcher, best rates (GB/s) over repetitions:
// STREAM's triad a = b + s c (12 bytes per element: two reads, one write to a third array, which
// costs a read for ownership besides), and an in-place update a = a + s b (12 bytes: two reads,
// a write back to a line just read), the access pattern of AdamW and of gradient accumulation.
struct StreamRates {
  double triad = 0, update = 0;
  int reps = 0;
};
StreamRates stream_rates(std::int64_t mib, double min_time) {
  const std::int64_t n = mib * (std::int64_t{1} << 20) / static_cast<std::int64_t>(sizeof(float));
  trident::FloatView a("stream_a", static_cast<size_t>(n)), b("stream_b", static_cast<size_t>(n)),
      c("stream_c", static_cast<size_t>(n));
  Kokkos::deep_copy(b, 1.0f);
  Kokkos::deep_copy(c, 2.0f);
  const float s = 3.0f;
  double best_triad = 1e30, best_update = 1e30, spent = 0;
  StreamRates r;
  while (r.reps < 3 || (spent < min_time && r.reps < 200)) {
    Kokkos::fence();
    double t0 = now_s();
    trident::for_each_index(
        "stream_triad", n, KOKKOS_LAMBDA(std::int64_t i) { a(i) = b(i) + s * c(i); });
    Kokkos::fence();
    double t = now_s() - t0;
    best_triad = std::min(best_triad, t);
    spent += t;
    t0 = now_s();
    trident::for_each_index(
        "stream_update", n, KOKKOS_LAMBDA(std::int64_t i) { a(i) = a(i) + s * b(i); });
    Kokkos::fence();
    t = now_s() - t0;
    best_update = std::min(best_update, t);
    spent += t;
    ++r.reps;
  }
  r.triad = 12.0 * static_cast<double>(n) / best_triad / 1e9;
  r.update = 12.0 * static_cast<double>(n) / best_update / 1e9;
  return r;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // The GEMM library's threads: OMP_NUM_THREADS (0 here: not set, the library's default).
  int threads = 0;
  if (const char* e = std::getenv("OMP_NUM_THREADS")) threads = std::atoi(e);
  std::ostringstream js;
  js << std::setprecision(9) << "{\n  \"dtype\": \"" << (o.bf16 ? "bf16" : "fp32") << "\",\n  \"backend\": \""
     << trident::gemm_backend_name() << "\",\n  \"threads\": " << threads << ",\n  \"tokens\": " << o.tokens
     << ",\n  \"seq\": " << o.seq << ",\n  \"vocab_padded\": " << o.vocab << ",\n  \"models\": [";
  std::cout << "gemm_roofline: "
            << (o.bf16 ? "bf16 (fp32 accumulation) GEMM through trident::gemm_bf16" : "fp32 GEMM through trident::gemm")
            << " (" << trident::gemm_backend_name() << "), "
            << (threads > 0 ? std::to_string(threads) : std::string("default (OMP_NUM_THREADS unset)"))
            << " thread(s); tokens N = " << o.tokens << " (B = " << o.tokens / o.seq << ", T = " << o.seq
            << "), padded vocab " << o.vocab << "\n";
  for (std::size_t ci = 0; ci < o.hidden.size(); ++ci) {
    const std::int64_t C = o.hidden[ci];
    std::vector<Shape> shapes = step_shapes(o, ci);
    std::cout << "\nhidden C = " << C << " (heads " << C / o.head_dim << " x " << o.head_dim << ", "
              << (o.groups[ci] > 0 ? o.groups[ci] : C / o.head_dim) << " key/value groups, ffn "
              << (o.ffn[ci] > 0 ? o.ffn[ci] : 4 * C) << (o.swiglu ? " SwiGLU" : "")
              << "); calls are per layer (LM head: per step), MFLOP per call\n"
              << std::left << std::setw(30) << "GEMM" << std::right << std::setw(3) << "op" << std::setw(8) << "M"
              << std::setw(8) << "N" << std::setw(8) << "K" << std::setw(7) << "batch" << std::setw(6) << "calls"
              << std::setw(10) << "MFLOP" << std::setw(11) << "median ms" << std::setw(10) << "GFLOP/s" << std::setw(10)
              << "best"
              << "\n";
    double layer_flops = 0, layer_time = 0, head_flops = 0, head_time = 0;
    js << (ci ? "," : "") << "\n    {\"hidden\": " << C << ", \"head_dim\": " << o.head_dim
       << ", \"ffn\": " << (o.ffn[ci] > 0 ? o.ffn[ci] : 4 * C)
       << ", \"groups\": " << (o.groups[ci] > 0 ? o.groups[ci] : C / o.head_dim)
       << ", \"swiglu\": " << (o.swiglu ? "true" : "false") << ", \"shapes\": [";
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      Shape& s = shapes[i];
      time_shape(s, o.min_time, o.bf16);
      (s.per_layer ? layer_flops : head_flops) += static_cast<double>(s.calls) * s.flops();
      (s.per_layer ? layer_time : head_time) += static_cast<double>(s.calls) * s.median_s;
      std::cout << std::left << std::setw(30) << s.name << std::right << std::setw(2) << tname(s.ta) << tname(s.tb)
                << std::setw(8) << s.M << std::setw(8) << s.N << std::setw(8) << s.K << std::setw(7) << s.batch
                << std::setw(6) << s.calls << std::fixed << std::setprecision(1) << std::setw(10) << s.flops() / 1e6
                << std::setprecision(3) << std::setw(11) << s.median_s * 1e3 << std::setprecision(1) << std::setw(10)
                << s.flops() / s.median_s / 1e9 << std::setw(10) << s.flops() / s.best_s / 1e9 << "\n";
      js << (i ? "," : "") << "\n      {\"name\": \"" << s.name << "\", \"op\": \"" << tname(s.ta) << tname(s.tb)
         << "\", \"M\": " << s.M << ", \"N\": " << s.N << ", \"K\": " << s.K << ", \"batch\": " << s.batch
         << ", \"calls\": " << s.calls << ", \"beta\": " << s.beta
         << ", \"per_layer\": " << (s.per_layer ? "true" : "false") << ", \"flops\": " << s.flops()
         << ", \"median_s\": " << s.median_s << ", \"best_s\": " << s.best_s << ", \"reps\": " << s.reps << "}";
    }
    js << "\n    ], \"layer_flops\": " << layer_flops << ", \"layer_time_s\": " << layer_time
       << ", \"head_flops\": " << head_flops << ", \"head_time_s\": " << head_time << "}";
    std::cout << std::setprecision(1) << "per layer: " << layer_flops / 1e9 << " GFLOP in " << std::setprecision(3)
              << layer_time * 1e3 << " ms = " << std::setprecision(1) << layer_flops / layer_time / 1e9
              << " GFLOP/s; LM head: " << head_flops / 1e9 << " GFLOP in " << std::setprecision(3) << head_time * 1e3
              << " ms = " << std::setprecision(1) << head_flops / head_time / 1e9 << " GFLOP/s\n";
    for (std::int64_t L : {6, 12}) {
      const double f = L * layer_flops + head_flops, t = L * layer_time + head_time;
      std::cout << "  roofline for " << L << " layers: " << std::setprecision(2) << f / 1e9 << " GFLOP per step in "
                << std::setprecision(2) << t * 1e3 << " ms of GEMM = " << std::setprecision(1) << f / t / 1e9
                << " GFLOP/s\n";
    }
  }
  js << "\n  ]";
  if (o.square > 0) {
    Shape sq{"square", Trans::N, Trans::N, o.square, o.square, o.square, 1, 0.f, false};
    time_shape(sq, std::max(o.min_time, 0.5), o.bf16);
    std::cout << "\nsquare " << o.square << "^3 NN: median " << std::setprecision(2) << sq.median_s * 1e3
              << " ms = " << std::setprecision(1) << sq.flops() / sq.median_s / 1e9 << " GFLOP/s (best "
              << sq.flops() / sq.best_s / 1e9 << ") -- the peak\n";
    js << ",\n  \"square\": {\"n\": " << o.square << ", \"flops\": " << sq.flops() << ", \"median_s\": " << sq.median_s
       << ", \"best_s\": " << sq.best_s << ", \"reps\": " << sq.reps << "}";
  }
  if (o.stream_mib > 0) {
    const StreamRates r = stream_rates(o.stream_mib, o.min_time);
    std::cout << "\nmemory bandwidth (3 arrays of " << o.stream_mib << " MiB, host kernels' threads, best of " << r.reps
              << "): triad a = b + s c " << std::setprecision(1) << r.triad << " GB/s, in-place a = a + s b "
              << r.update << " GB/s\n";
    js << ",\n  \"stream\": {\"mib\": " << o.stream_mib << ", \"triad_gb_per_s\": " << r.triad
       << ", \"update_gb_per_s\": " << r.update << ", \"gb_per_s\": " << std::max(r.triad, r.update)
       << ", \"reps\": " << r.reps << "}";
  }
  js << "\n}\n";
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    TRIDENT_REQUIRE(f, "gemm_roofline: cannot write " << o.json);
    f << js.str();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return trident::run_app(argc, argv, run); }
