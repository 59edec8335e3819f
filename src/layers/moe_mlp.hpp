// The mixture-of-experts module of the MLP slot (mlp.hpp; docs/DESIGN.md "Mixture of experts";
// Megatron-core's MoELayer with its TopKRouter and token permutation):
//
//   logits = x W_r^T (fp32)  ->  top-k routing (ops/moe)  ->  the (token, expert) selections
//   grouped by expert (dropless, or with capacity drops)  ->  each expert's MLP over its rows, the
//   experts' GEMMs as one grouped GEMM (ops/gemm)  ->  out[t] = sum_j probs[t, j] expert_j(x[t])
//   (+ a shared expert: a dense MLP beside them)
//
// A rank routes its own tokens (the sequence-parallel rows under tp > 1) over every expert, whose
// weights it holds whole (Megatron's expert tensor parallelism 1): the router's and the experts'
// gradients are partial sums over TP, all-reduced with the other replicated parameters (MoE
// layers need sequence parallelism under tp > 1, which all-reduces them).
// Load balancing adds Megatron's auxiliary loss and the router z-loss to the objective through
// their gradients (MoeState::aux_grad_scale); MoeState collects each layer's losses and loads for
// the metrics.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "layers/mlp.hpp"

namespace trident {

// What an iteration's MoE layers report (one per model chunk, shared by its layers): summed over
// the micro-batches whose backward pass ran (each once, recomputation or not).
struct MoeLayerStats {
  double aux = 0;                // sum over micro-batches of the unscaled load-balancing loss
  double z = 0;                  // sum over micro-batches of the mean squared log-sum-exp of this rank's tokens
  std::int64_t micro = 0;        // micro-batches
  std::vector<double> selected;  // (E) selections per expert before capacity drops, this rank's tokens
  double dropped = 0;            // selections dropped by capacity, this rank's tokens
};
struct MoeState {
  // d objective / d (one micro-batch's load-balancing or z loss): set by the trainer before each
  // iteration's passes (its loss normalisation, times the fp16 loss scale)
  float aux_grad_scale = 1.f;
  std::map<std::int64_t, MoeLayerStats> layers;  // by global layer
  // the last forward pass's unscaled (load-balancing, z) losses of this rank's part, by global
  // layer: what the gradient differentiates (tests)
  std::map<std::int64_t, std::pair<double, double>> last_forward;
  // wall seconds of this rank's MoE layers since the start, forward and backward passes together
  // (each part ends at a fence): router (logits, routing and its backward), dispatch (the plan,
  // permutation and its inverse), experts (their GEMMs and activations), combine (the weighted
  // sum, its backward, the shared expert)
  enum Part { kRouter, kDispatch, kExperts, kCombine };
  // the expert biases of the chunk's MoE layers (router_enable_expert_bias), by global layer:
  // fp32 model state, updated by the trainer after each iteration (update_expert_bias)
  std::map<std::int64_t, FloatView> expert_bias;
  double seconds[4] = {0, 0, 0, 0};
  void reset() { layers.clear(); }
};

// The MoE module of global layer `layer` with its input side's parameters under `prefix`.
std::unique_ptr<MlpModule> make_moe_mlp(ParamStore& store, const std::string& prefix, const TransformerShape& s,
                                        std::int64_t layer);

}  // namespace trident
