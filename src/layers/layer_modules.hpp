// The slots of the one transformer layer (docs/DESIGN.md "Layer spec") and the registries that
// fill them by name from the architecture (common/model_arch's ModelArch):
//   normalisation  ModelArch::normalization     LayerNorm (layers/layer_norm)
//   normalisation  (entries)                    RMSNorm (layers/rms_norm)
//   MLP activation ModelArch::mlp_activation()  gelu (bias + GELU), swiglu (bias + SiLU-gated)
//   positions      ModelArch::position_embedding_type  learned_absolute (the embedding's table),
//                                               rope (ops/rope on the queries and keys), none
//   q/k norms      ModelArch::qk_layernorm      off, or the normalisation slot's module per head
// A module implements its slot's interface; a variant is one module plus one entry in its slot's
// registry (layer_modules.cpp), and the layer, the model and the deck's check read it by name.
// An unknown name is one error naming the deck key and the registry's names.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "common/model_arch.hpp"
#include "layers/param_store.hpp"
#include "ops/fused.hpp"
#include "ops/rope.hpp"

namespace trident {

// Normalisation over the last dimension of (N, C) fp32 rows with fp32 statistics; out is fp32 or
// (16-bit parameters) 16-bit words. mean may be unused by a module (RMSNorm); backward ADDS the
// input gradient to dx and accumulates the parameters' gradients.
class NormModule {
 public:
  virtual ~NormModule() = default;
  // pre on: x = pre.residual + dropout(pre.branch + pre.bias) first, stored (ops/fused.hpp ResidualAdd)
  virtual void forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, std::int64_t N,
                       const ResidualAdd& pre = {}) const = 0;
  virtual void backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView& mean,
                        const FloatView& rstd, std::int64_t N) const = 0;
};

// The normalisation slot: a handle to the module the architecture names (declares its
// parameters under `name` when built).
class Norm {
 public:
  Norm() = default;
  Norm(ParamStore& store, const std::string& name, std::int64_t C, const ModelArch& arch);
  void forward(const Act& out, const FloatView& mean, const FloatView& rstd, const FloatView& x, std::int64_t N,
               const ResidualAdd& pre = {}) const {
    m_->forward(out, mean, rstd, x, N, pre);
  }
  void forward(const FloatView& out, const FloatView& mean, const FloatView& rstd, const FloatView& x,
               std::int64_t N) const {
    m_->forward(act(out), mean, rstd, x, N);
  }
  void backward(const FloatView& dx, const FloatView& dout, const FloatView& x, const FloatView& mean,
                const FloatView& rstd, std::int64_t N) const {
    m_->backward(dx, dout, x, mean, rstd, N);
  }

 private:
  std::shared_ptr<const NormModule> m_;
};

// The q/k normalisation (ModelArch::qk_layernorm; Qwen 3, Megatron's --qk-layernorm): a norm of
// the normalisation slot over each head's hs channels, `q_layernorm` for the query heads and
// `k_layernorm` for the key groups, applied to qkv after the projection and before rotary
// positions. A rank normalises its own heads, so the weights' gradients are partial sums over
// TP (ParamInfo::tp_partial_grad). Off: no parameters, and forward / backward do nothing.
class QkNorm {
 public:
  QkNorm() = default;
  // nq query heads from column 0 and nk key heads from column nq hs of (rows, width) qkv rows
  QkNorm(ParamStore& store, const std::string& prefix, const ModelArch& arch, std::int64_t nq, std::int64_t nk,
         std::int64_t hs, std::int64_t width);
  bool on() const { return on_; }
  // what a forward pass over `rows` rows keeps: the normalised heads' fp32 inputs, and one
  // statistic per head and row
  std::int64_t kept(std::int64_t rows) const { return rows * (nq_ + nk_) * hs_; }
  std::int64_t stats(std::int64_t rows) const { return rows * (nq_ + nk_); }
  // qkv's q and k heads normalised in place; x (kept), mean and rstd (stats) kept for the backward
  // pass; out (kept, qkv's storage type) a workspace
  void forward(const Act& qkv, std::int64_t rows, const FloatView& x, const FloatView& mean, const FloatView& rstd,
               const Act& out) const;
  // dqkv (rows, width) fp32: of the q and k heads, the gradient w.r.t. the norms' outputs in and
  // w.r.t. their inputs out (in place); dout and dx (kept) fp32 workspaces
  void backward(const FloatView& dqkv, std::int64_t rows, const FloatView& x, const FloatView& mean,
                const FloatView& rstd, const FloatView& dout, const FloatView& dx) const;

 private:
  bool on_ = false;
  Norm q_, k_;
  std::int64_t nq_ = 0, nk_ = 0, hs_ = 0, width_ = 0;
};

// The MLP's activation between fc1 and fc2, with fc1's bias fused in. fc1 has blocks() x F
// output columns per F of the activation (1; a gated unit 2: gate then up), F = this rank's
// ffn columns.
class MlpActivation {
 public:
  virtual ~MlpActivation() = default;
  virtual std::int64_t blocks() const = 0;
  // pre (rows, blocks F) = y + bias, kept for the backward pass; out (rows, F) = act(pre). y is
  // fc1's fp32 GEMM output (pre's own buffer in fp32); pre, out and bias share one storage type.
  virtual void forward(const Act& pre, const Act& out, const FloatView& y, const Act& bias, std::int64_t rows,
                       std::int64_t F) const = 0;
  // dpre (rows, blocks F) = d act(pre) given dout (rows, F); overwrites dpre.
  virtual void backward(const FloatView& dpre, const FloatView& dout, const Act& pre, std::int64_t rows,
                        std::int64_t F) const = 0;
  // Inference (fp32): out (rows, F) = act(pre), pre (rows, blocks F) with its bias added.
  virtual void infer(const FloatView& out, const FloatView& pre, std::int64_t rows, std::int64_t F) const = 0;
  // Whether fc1's GEMM can apply bias and activation itself (ColumnParallelLinear::forward_gelu:
  // the tanh GELU of one block), where it can (device kernels, 16-bit, no adapters).
  virtual bool gelu_in_gemm() const { return false; }
  // The backward as fc1's output gradient in 16 bits (16-bit pre): dpre16 (rows, blocks F) =
  // round(d act(pre)), and with dbias not empty fc1's bias gradient added in the same pass. Returns
  // false, having done nothing, where the activation has no such pass (then backward and fc1's own
  // rounding run).
  virtual bool backward_half(const HalfView& /*dpre16*/, const FloatView& /*dbias*/, const FloatView& /*dout*/,
                             const Act& /*pre*/, std::int64_t /*rows*/, std::int64_t /*F*/) const {
    return false;
  }
};
std::shared_ptr<const MlpActivation> make_mlp_activation(const ModelArch& arch);

// The position encoding. A learned table lives in the model's embedding (learned_table()); a
// rotary one turns the query and key heads of each layer's qkv after the projection and turns
// their gradient back before it.
class PositionEncoding {
 public:
  virtual ~PositionEncoding() = default;
  virtual bool learned_table() const { return false; }
  // qkv (l.rows, l.width) in place; positions (l.rows) or empty: row % l.T
  virtual void apply(const Act& qkv, const RopeLayout& l, const IntView& positions) const {}
  // dqkv fp32, or 16-bit words (the device path's gradient from cuDNN's attention)
  virtual void apply_backward(const Act& dqkv, const RopeLayout& l, const IntView& positions) const {}
};
// hs: the head dimension; positions: the longest sequence the model runs (model.max_position_embeddings).
std::shared_ptr<const PositionEncoding> make_position_encoding(const ModelArch& arch, std::int64_t hs,
                                                               std::int64_t positions);

// Fails with one error naming the deck key and the registered names when the architecture names
// a module no slot has.
void check_layer_modules(const ModelArch& arch);

}  // namespace trident
