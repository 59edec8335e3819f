// The slots' registries (layer_modules.hpp): each entry is a name and how to build its module.
// A new variant adds its module and one line here.
#include "layers/layer_modules.hpp"

#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "layers/layer_norm.hpp"
#include "layers/rms_norm.hpp"
#include "ops/fused.hpp"
#include "ops/gelu.hpp"
#include "ops/heads.hpp"
#include "ops/swiglu.hpp"

namespace trident {

namespace {

// bias + GELU (tanh form, GPT-2): fc1's bias and the activation in one pass (ops/fused).
class GeluActivation final : public MlpActivation {
 public:
  std::int64_t blocks() const override { return 1; }
  void forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
               std::int64_t F) const override {
    bias_gelu_forward(pre, out, y, bias, rows, F);
  }
  void backward(const FloatView& dpre, const FloatView& dout, const Act& pre, std::int64_t rows,
                std::int64_t F) const override {
    gelu_backward(dpre, dout, pre, rows * F);
  }
  void infer(const FloatView& out, const FloatView& pre, std::int64_t rows, std::int64_t F) const override {
    gelu_forward(act(out), act(pre), rows * F);
  }
  bool gelu_in_gemm() const override { return true; }
  bool backward_half(const HalfView& dpre16, const FloatView& dbias, const FloatView& dout, const Act& pre,
                     std::int64_t rows, std::int64_t F) const override {
    if (!pre.is_half()) return false;
    gelu_backward_pack_half(pre.dt, dpre16, dbias, dout, pre.h, rows, F);
    return true;
  }
};

// bias + SwiGLU: fc1's [gate | up] (ops/swiglu), silu(gate) * up.
class SwigluActivation final : public MlpActivation {
 public:
  std::int64_t blocks() const override { return 2; }
  void forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
               std::int64_t F) const override {
    bias_swiglu_forward(pre, out, y, bias, rows, F);
  }
  void backward(const FloatView& dpre, const FloatView& dout, const Act& pre, std::int64_t rows,
                std::int64_t F) const override {
    swiglu_backward(dpre, dout, pre, rows, F);
  }
  void infer(const FloatView& out, const FloatView& pre, std::int64_t rows, std::int64_t F) const override {
    swiglu_forward(out, pre, rows, F);
  }
  bool backward_half(const HalfView& dpre16, const FloatView& dbias, const FloatView& dout, const Act& pre,
                     std::int64_t rows, std::int64_t F) const override {
    if (!pre.is_half() || dbias.extent(0) > 0) return false;  // a biased SwiGLU keeps the separate passes
    swiglu_backward_pack_half(pre.dt, dpre16, dout, pre.h, rows, F);
    return true;
  }
};

class LearnedPositions final : public PositionEncoding {
 public:
  bool learned_table() const override { return true; }
};
class NoPositions final : public PositionEncoding {};

// Rotary positions: one cos / sin table per frequency set and length, shared by the layers that
// use it (the cache holds weak references, so the table goes with its last layer, before Kokkos
// is finalised).
class RotaryPositions final : public PositionEncoding {
 public:
  RotaryPositions(const RopeFrequencies& f, std::int64_t positions) : table_(make_rope_table(f, positions)) {}
  void apply(const Act& qkv, const RopeLayout& l, const IntView& positions) const override {
    rope_forward(qkv, table_, l, positions);
  }
  void apply_backward(const Act& dqkv, const RopeLayout& l, const IntView& positions) const override {
    rope_backward(dqkv, table_, l, positions);
  }

 private:
  RopeTable table_;
};

std::shared_ptr<const PositionEncoding> rotary(const ModelArch& a, std::int64_t hs, std::int64_t positions) {
  RopeFrequencies f;
  f.rot = static_cast<std::int64_t>(static_cast<double>(hs) * a.rotary_percent);
  f.base = a.rotary_base;
  f.scaling = a.use_rope_scaling;
  f.factor = a.rope_scaling_factor;
  f.low_freq_factor = a.rope_low_freq_factor;
  f.high_freq_factor = a.rope_high_freq_factor;
  f.original_max_positions = static_cast<double>(a.rope_original_max_position_embeddings);
  using Key = std::tuple<std::int64_t, double, bool, double, double, double, double, std::int64_t>;
  static std::mutex m;
  static std::map<Key, std::weak_ptr<const PositionEncoding>> cache;
  const Key k{f.rot,    f.base, f.scaling, f.factor, f.low_freq_factor, f.high_freq_factor, f.original_max_positions,
              positions};
  const std::lock_guard<std::mutex> lock(m);
  if (auto p = cache[k].lock()) return p;
  std::shared_ptr<const PositionEncoding> p = std::make_shared<RotaryPositions>(f, positions);
  cache[k] = p;
  return p;
}

template <class Make>
struct Entry {
  const char* name;
  Make make;
};

using MakeNorm = std::function<std::shared_ptr<const NormModule>(ParamStore&, const std::string&, std::int64_t, float)>;
using MakeActivation = std::function<std::shared_ptr<const MlpActivation>()>;
using MakePositions =
    std::function<std::shared_ptr<const PositionEncoding>(const ModelArch&, std::int64_t, std::int64_t)>;

// ---- the registries: one entry per variant ----
const std::vector<Entry<MakeNorm>>& normalizations() {
  static const std::vector<Entry<MakeNorm>> r = {
      {"LayerNorm", [](ParamStore& s, const std::string& n, std::int64_t C,
                       float eps) { return std::make_shared<LayerNorm>(s, n, C, eps); }},
      {"RMSNorm", [](ParamStore& s, const std::string& n, std::int64_t C,
                     float eps) { return std::make_shared<RMSNorm>(s, n, C, eps); }},
  };
  return r;
}

const std::vector<Entry<MakeActivation>>& mlp_activations() {
  static const std::vector<Entry<MakeActivation>> r = {
      {"gelu", [] { return std::make_shared<GeluActivation>(); }},
      {"swiglu", [] { return std::make_shared<SwigluActivation>(); }},
  };
  return r;
}

const std::vector<Entry<MakePositions>>& position_encodings() {
  static const std::vector<Entry<MakePositions>> r = {
      {"learned_absolute",
       [](const ModelArch&, std::int64_t, std::int64_t) { return std::make_shared<LearnedPositions>(); }},
      {"rope", rotary},
      {"none", [](const ModelArch&, std::int64_t, std::int64_t) { return std::make_shared<NoPositions>(); }},
  };
  return r;
}
// ----

template <class E>
const E& lookup(const std::vector<E>& registry, const std::string& name, const char* key) {
  for (const E& e : registry)
    if (name == e.name) return e;
  std::ostringstream names;
  for (const E& e : registry) names << (&e == &registry.front() ? "" : ", ") << e.name;
  throw Error::all("deck: " + std::string(key) + " = '" + name + "' is not one of the layer's modules (" + names.str() +
                   ")");
}

}  // namespace

Norm::Norm(ParamStore& store, const std::string& name, std::int64_t C, const ModelArch& arch)
    : m_(lookup(normalizations(), arch.normalization, "model.normalization").make(store, name, C, arch.eps())) {}

QkNorm::QkNorm(ParamStore& store, const std::string& prefix, const ModelArch& arch, std::int64_t nq, std::int64_t nk,
               std::int64_t hs, std::int64_t width)
    : on_(arch.qk_layernorm), nq_(nq), nk_(nk), hs_(hs), width_(width) {
  if (!on_) return;
  q_ = Norm(store, prefix + "/q_layernorm", hs, arch);
  k_ = Norm(store, prefix + "/k_layernorm", hs, arch);
  store.mark_tp_partial_grad(prefix + "/q_layernorm/");
  store.mark_tp_partial_grad(prefix + "/k_layernorm/");
}

namespace {
Act act_slice(const Act& a, std::int64_t offset, std::int64_t n) {
  return a.is_half() ? Act(a.dt, slice(a.h, offset, n)) : Act(slice(a.f, offset, n));
}
}  // namespace

void QkNorm::forward(const Act& qkv, std::int64_t rows, const FloatView& x, const FloatView& mean,
                     const FloatView& rstd, const Act& out) const {
  if (!on_) return;
  const std::int64_t nq = rows * nq_, nk = rows * nk_;  // normalised rows of hs channels
  heads_gather(slice(x, 0, nq * hs_), qkv, rows, width_, 0, nq_ * hs_);
  heads_gather(slice(x, nq * hs_, nk * hs_), qkv, rows, width_, nq_ * hs_, nk_ * hs_);
  q_.forward(act_slice(out, 0, nq * hs_), slice(mean, 0, nq), slice(rstd, 0, nq), slice(x, 0, nq * hs_), nq);
  k_.forward(act_slice(out, nq * hs_, nk * hs_), slice(mean, nq, nk), slice(rstd, nq, nk), slice(x, nq * hs_, nk * hs_),
             nk);
  heads_scatter(qkv, act_slice(out, 0, nq * hs_), rows, width_, 0, nq_ * hs_);
  heads_scatter(qkv, act_slice(out, nq * hs_, nk * hs_), rows, width_, nq_ * hs_, nk_ * hs_);
}

void QkNorm::backward(const FloatView& dqkv, std::int64_t rows, const FloatView& x, const FloatView& mean,
                      const FloatView& rstd, const FloatView& dout, const FloatView& dx) const {
  if (!on_) return;
  const std::int64_t nq = rows * nq_, nk = rows * nk_, n = (nq + nk) * hs_;
  heads_gather(slice(dout, 0, nq * hs_), dqkv, rows, width_, 0, nq_ * hs_);
  heads_gather(slice(dout, nq * hs_, nk * hs_), dqkv, rows, width_, nq_ * hs_, nk_ * hs_);
  device_copy(slice(dx, 0, n), 0.f);  // the norms' backward adds to dx
  q_.backward(slice(dx, 0, nq * hs_), slice(dout, 0, nq * hs_), slice(x, 0, nq * hs_), slice(mean, 0, nq),
              slice(rstd, 0, nq), nq);
  k_.backward(slice(dx, nq * hs_, nk * hs_), slice(dout, nq * hs_, nk * hs_), slice(x, nq * hs_, nk * hs_),
              slice(mean, nq, nk), slice(rstd, nq, nk), nk);
  heads_scatter(act(dqkv), act(slice(dx, 0, nq * hs_)), rows, width_, 0, nq_ * hs_);
  heads_scatter(act(dqkv), act(slice(dx, nq * hs_, nk * hs_)), rows, width_, nq_ * hs_, nk_ * hs_);
}

std::shared_ptr<const MlpActivation> make_mlp_activation(const ModelArch& arch) {
  return lookup(mlp_activations(), arch.mlp_activation(), "model.swiglu").make();
}

std::shared_ptr<const PositionEncoding> make_position_encoding(const ModelArch& arch, std::int64_t hs,
                                                               std::int64_t positions) {
  return lookup(position_encodings(), arch.position_embedding_type, "model.position_embedding_type")
      .make(arch, hs, positions);
}

void check_layer_modules(const ModelArch& arch) {
  lookup(normalizations(), arch.normalization, "model.normalization");
  lookup(mlp_activations(), arch.mlp_activation(), "model.swiglu");
  lookup(position_encodings(), arch.position_embedding_type, "model.position_embedding_type");
}

}  // namespace trident
