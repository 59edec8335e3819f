// The slots' registries (layer_modules.hpp): each entry is a name and how to build its module.
// A new variant adds its module and one line here.
#include "layers/layer_modules.hpp"

#include <functional>
#include <sstream>

#include "common/error.hpp"
#include "layers/layer_norm.hpp"
#include "ops/fused.hpp"
#include "ops/gelu.hpp"

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
};

template <class Make>
struct Entry {
  const char* name;
  Make make;
};

using MakeNorm = std::function<std::shared_ptr<const NormModule>(ParamStore&, const std::string&, std::int64_t, float)>;
using MakeActivation = std::function<std::shared_ptr<const MlpActivation>()>;

// ---- the registries: one entry per variant ----
const std::vector<Entry<MakeNorm>>& normalizations() {
  static const std::vector<Entry<MakeNorm>> r = {
      {"LayerNorm", [](ParamStore& s, const std::string& n, std::int64_t C,
                       float eps) { return std::make_shared<LayerNorm>(s, n, C, eps); }},
  };
  return r;
}

const std::vector<Entry<MakeActivation>>& mlp_activations() {
  static const std::vector<Entry<MakeActivation>> r = {
      {"gelu", [] { return std::make_shared<GeluActivation>(); }},
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

std::shared_ptr<const MlpActivation> make_mlp_activation(const ModelArch& arch) {
  return lookup(mlp_activations(), arch.mlp_activation(), "model.swiglu").make();
}

void check_layer_modules(const ModelArch& arch) {
  lookup(normalizations(), arch.normalization, "model.normalization");
  lookup(mlp_activations(), arch.mlp_activation(), "model.swiglu");
}

}  // namespace trident
