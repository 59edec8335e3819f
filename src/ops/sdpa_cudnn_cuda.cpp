// cuDNN's fused attention (ops/sdpa_plan.hpp): the only file that includes the cuDNN frontend, a
// header-only library found by CMake (TRIDENT_CUDNN_FRONTEND, brought into the GPU kit; never part
// of the repository). Compiled with the host compiler (no Kokkos here). The frontend loads
// libcudnn.so.9 at run time (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so the build needs only
// headers and a machine without cuDNN refuses the entry with the loader's message.
#if defined(TRIDENT_HAVE_CUDNN)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cudnn_frontend.h>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "ops/sdpa_plan.hpp"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's dynamic loading reads libcudnn through it
}

namespace trident {
namespace cudnn_sdpa {
namespace {

namespace fe = cudnn_frontend;

// the graphs' tensor ids
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeed, kOffset, kSeqQ, kSeqKV };

constexpr std::size_t kMinVersion = 90100;  // grouped-query heads in the backward graph

std::string load() {
  dlerror();
  cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
  if (!cudnn_frontend::cudnn_dlhandle) {
    const char* e = dlerror();
    return std::string("libcudnn.so.9 does not load (") + (e ? e : "?") +
           "; set LD_LIBRARY_PATH to a cuDNN 9 library folder)";
  }
  try {
    const std::size_t v = fe::detail::get_backend_version();
    if (v < kMinVersion) {
      std::ostringstream why;
      why << "cuDNN " << v << " is older than " << kMinVersion << " (grouped-query attention's backward)";
      return why.str();
    }
  } catch (const std::exception& e) {
    return std::string("cuDNN's version could not be read: ") + e.what();
  }
  return "";
}

cudnnHandle_t handle(void* stream) {
  static cudnnHandle_t h = [] {
    cudnnHandle_t c = nullptr;
    TRIDENT_REQUIRE(fe::detail::create_handle(&c) == CUDNN_STATUS_SUCCESS, "cuDNN: cudnnCreate failed");
    return c;
  }();
  TRIDENT_REQUIRE(fe::detail::set_stream(h, static_cast<cudaStream_t>(stream)) == CUDNN_STATUS_SUCCESS,
                  "cuDNN: cudnnSetStream failed");
  return h;
}

void check(fe::error_t e, const char* what, const SdpaPlan& p) {
  TRIDENT_REQUIRE(e.is_good(),
                  "cuDNN fused attention: " << what << " failed for " << p.key() << ": " << e.get_message());
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                     const SdpaTensor& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({t.dim[0], t.dim[1], t.dim[2], t.dim[3]})
                      .set_stride({t.stride[0], t.stride[1], t.stride[2], t.stride[3]}));
}
std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph& g, const char* name, Uid uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}
// a padded plan's sequence lengths: one int32 per sample
std::shared_ptr<fe::graph::Tensor_attributes> lengths(fe::graph::Graph& g, const char* name, Uid uid, std::int64_t b) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({b, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}
void set_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const SdpaTensor& s) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({s.dim[0], s.dim[1], s.dim[2], s.dim[3]})
      .set_stride({s.stride[0], s.stride[1], s.stride[2], s.stride[3]});
}

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
};

std::shared_ptr<fe::graph::Graph> new_graph(const SdpaPlan& p) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(p.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

template <class Attr>
void common_options(Attr& a, const SdpaPlan& p, fe::graph::Graph& g) {
  a.set_attn_scale(p.scale);
  if (p.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (p.dropout > 0.f) a.set_dropout(p.dropout, scalar(g, "seed", kSeed), scalar(g, "offset", kOffset));
  if (p.padded)
    a.set_padding_mask(true)
        .set_seq_len_q(lengths(g, "seq_len_q", kSeqQ, p.b))
        .set_seq_len_kv(lengths(g, "seq_len_kv", kSeqKV, p.b));
}

void finish(Built& b, const SdpaPlan& p, cudnnHandle_t h) {
  check(b.graph->validate(), "validate", p);
  check(b.graph->build_operation_graph(h), "build_operation_graph", p);
  check(b.graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", p);
  check(b.graph->check_support(h), "check_support", p);
  check(b.graph->build_plans(h), "build_plans", p);
  check(b.graph->get_workspace_size(b.workspace), "get_workspace_size", p);
}

Built build_forward(const SdpaPlan& p, cudnnHandle_t h) {
  Built b{new_graph(p)};
  fe::graph::Graph& g = *b.graph;
  auto Q = tensor(g, "Q", kQ, p.q), K = tensor(g, "K", kK, p.k), V = tensor(g, "V", kV, p.v);
  auto a = fe::graph::SDPA_attributes().set_name("trident_sdpa").set_generate_stats(true);
  common_options(a, p, g);
  auto [O, stats] = g.sdpa(Q, K, V, a);
  set_output(O, kO, p.o);
  set_output(stats, kStats, p.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  finish(b, p, h);
  return b;
}

Built build_backward(const SdpaPlan& p, cudnnHandle_t h) {
  Built b{new_graph(p)};
  fe::graph::Graph& g = *b.graph;
  auto Q = tensor(g, "Q", kQ, p.q), K = tensor(g, "K", kK, p.k), V = tensor(g, "V", kV, p.v);
  auto O = tensor(g, "O", kO, p.o), dO = tensor(g, "dO", kDO, p.o);
  auto stats = tensor(g, "stats", kStats, p.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  // deterministic: the same bits every run, as every other kernel of the step
  auto a = fe::graph::SDPA_backward_attributes().set_name("trident_sdpa_backward").set_deterministic_algorithm(true);
  common_options(a, p, g);
  auto [dQ, dK, dV] = g.sdpa_backward(Q, K, V, O, dO, stats, a);
  set_output(dQ, kDQ, p.q);
  set_output(dK, kDK, p.k);
  set_output(dV, kDV, p.v);
  finish(b, p, h);
  return b;
}

// The graphs built so far (per direction and plan: a few per model, found by comparing the plans'
// fields, SdpaPlan::same_graph) and one workspace for all, grown to the largest; building happens
// on a plan's first call only.
struct Entry {
  SdpaPlan plan;
  bool backward = false;
  Built built;
};
struct Cache {
  std::mutex m;
  std::vector<std::unique_ptr<Entry>> graphs;
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}

const Built& graph_for(const SdpaPlan& p, bool backward, cudnnHandle_t h, void*& workspace) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.m);
  for (const auto& e : c.graphs)
    if (e->backward == backward && e->plan.same_graph(p)) {
      workspace = c.workspace;
      return e->built;
    }
  auto e = std::make_unique<Entry>();
  e->plan = p;
  e->backward = backward;
  e->built = backward ? build_backward(p, h) : build_forward(p, h);
  if (e->built.workspace > c.workspace_bytes) {
    if (c.workspace) cudaFree(c.workspace);  // (cudaFree waits for the device's queued work)
    TRIDENT_REQUIRE(cudaMalloc(&c.workspace, static_cast<std::size_t>(e->built.workspace)) == cudaSuccess,
                    "cuDNN fused attention: no device memory for its " << e->built.workspace << "-byte workspace");
    c.workspace_bytes = e->built.workspace;
  }
  c.graphs.push_back(std::move(e));
  workspace = c.workspace;
  return c.graphs.back()->built;
}

void* at(const void* base, const SdpaTensor& t) {  // element (0, 0, 0, 0) of a 16-bit tensor
  return const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(base) + t.offset);
}

void run(const SdpaPlan& p, const Built& b, cudnnHandle_t h, std::unordered_map<std::int64_t, void*>& pack,
         void* workspace, const std::int64_t* rng, const std::int32_t* seq_q, const std::int32_t* seq_kv) {
  if (p.dropout > 0.f) {
    pack[kSeed] = const_cast<std::int64_t*>(rng);
    pack[kOffset] = const_cast<std::int64_t*>(rng + 1);
  }
  if (p.padded) {
    pack[kSeqQ] = const_cast<std::int32_t*>(seq_q);
    pack[kSeqKV] = const_cast<std::int32_t*>(seq_kv);
  }
  check(b.graph->execute(h, pack, workspace), "execute", p);
}

}  // namespace

std::string unavailable() {
  static const std::string why = load();
  return why;
}

void forward(const SdpaPlan& p, void* stream, const void* qkv, void* y, float* stats, const std::int64_t* rng,
             const std::int32_t* seq_q, const std::int32_t* seq_kv) {
  TRIDENT_REQUIRE(unavailable().empty(), "cuDNN fused attention: " << unavailable());
  const cudnnHandle_t h = handle(stream);
  void* workspace = nullptr;
  const Built& b = graph_for(p, false, h, workspace);
  std::unordered_map<std::int64_t, void*> pack = {
      {kQ, at(qkv, p.q)}, {kK, at(qkv, p.k)}, {kV, at(qkv, p.v)}, {kO, at(y, p.o)}, {kStats, stats}};
  run(p, b, h, pack, workspace, rng, seq_q, seq_kv);
}

void backward(const SdpaPlan& p, void* stream, const void* qkv, const void* y, const void* dy, const float* stats,
              void* dqkv, const std::int64_t* rng, const std::int32_t* seq_q, const std::int32_t* seq_kv) {
  TRIDENT_REQUIRE(unavailable().empty(), "cuDNN fused attention: " << unavailable());
  const cudnnHandle_t h = handle(stream);
  void* workspace = nullptr;
  const Built& b = graph_for(p, true, h, workspace);
  std::unordered_map<std::int64_t, void*> pack = {{kQ, at(qkv, p.q)},   {kK, at(qkv, p.k)},
                                                  {kV, at(qkv, p.v)},   {kO, at(y, p.o)},
                                                  {kDO, at(dy, p.o)},   {kStats, const_cast<float*>(stats)},
                                                  {kDQ, at(dqkv, p.q)}, {kDK, at(dqkv, p.k)},
                                                  {kDV, at(dqkv, p.v)}};
  run(p, b, h, pack, workspace, rng, seq_q, seq_kv);
}

}  // namespace cudnn_sdpa
}  // namespace trident
#endif
