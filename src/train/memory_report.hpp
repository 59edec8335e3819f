// Memory accounting: the bytes each rank holds for parameters, gradients, optimizer state and
// activations, measured from the allocated buffers, printed beside Megatron's figures:
//   bytes per parameter (Megatron-LM's distributed-optimizer table, megatron_bytes_per_param);
//   activations per transformer layer and micro-batch (Korthikanti et al. 2022, "Reducing
//   Activation Recomputation in Large Transformer Models", eq. 1-5) for s, b, h, a, t.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "comm/topology.hpp"

namespace trident {

// Megatron's bytes per parameter for a dtype ("fp32", "bf16", "fp16") and optimizer:
// non-distributed fp32 16, bf16 18, fp16 20; distributed over d ranks 8 + 8/d, 6 + 12/d, 4 + 16/d.
double megatron_bytes_per_param(const std::string& dtype, bool distributed, int d);

struct ActivationModel {
  double s = 0, b = 0, h = 0, a = 0;  // sequence, micro-batch, hidden, heads
  double t = 1;                       // tensor-parallel size
  double c = 1;                       // context-parallel size: a rank holds s / c tokens of a sequence
  bool sp = false;                    // sequence parallelism
  double e = 2;                       // bytes per stored activation value (2: 16-bit; 4: fp32)
  std::string recompute = "none";     // none | selective | full
  bool block = false;                 // full recomputation method block (else uniform)
  double group = 1;                   // recompute_num_layers
  double layers = 1;                  // layers of this model chunk
  bool flash = false;                 // fused attention: no as^2b term (like selective recomputation)
  double mlp = 8;  // the MLP's stored widths over h: (fc1 rows + fc2 inputs) / h (GPT-2 4 + 4; SwiGLU 3F/h)
  // the attention's stored widths over h: qkv's rows ((nh + 2 ng) d / h; multi-head 3) and proj's
  // input (nh d / h; 1), and the q/k norms' fp32 inputs ((nh + ng) d / h, 4 bytes; 0 without)
  double qkv = 3, proj = 1, qk_norm = 0;
  // MoE layers (averaged over the chunk's layers): their 4-byte values per token over h, the
  // experts' outputs (k h), the router's logits (E), log-sum-exp and normaliser (2), probabilities
  // (k) and the dispatch's three integer maps (3k); their e-byte values (each token's k experts'
  // fc1 outputs and fc2 inputs, the shared expert's) are in mlp
  double moe_fp32 = 0;
};

// Korthikanti et al.'s bytes per layer and micro-batch, with values of e bytes and 1-byte
// dropout masks: without recomputation sbh(16e + 2) + as^2b(2e + 1) -- for e = 2 the paper's
// sbh(34 + 5as/h) -- everything divided by t with sequence parallelism, and without it
// sbh(4e + 2 + 12e/t) + as^2b(2e + 1)/t; the MLP's 8e of these (fc1's output and fc2's input,
// 4h each) is mlp e for another MLP (SwiGLU: 2F + F), and the attention's q, k, v (3e) and proj
// input (e) are qkv e and proj e under grouped-query attention or another head dimension; the
// q/k norms add their fp32 inputs, 4 qk_norm sbh/t; selective recomputation drops the as^2b term; full
// recomputation keeps e*sbh (divided by t with SP) per recomputed group of layers, averaged
// over the chunk's layers.
double korthikanti_layer_bytes(const ActivationModel& m);

// The names of a rank's figures in the memory report's JSON, in order ("params_bytes", ...).
const std::vector<std::string>& memory_figure_names();

struct MemoryFigures {
  double params = 0, grads = 0, optimizer = 0;  // bytes
  double activations = 0;                       // peak bytes kept for micro-batches in flight
  double workspace = 0;                         // scratch shared by all micro-batches
  double layer_activations = 0;                 // bytes per transformer layer and micro-batch
  double local_params = 0;                      // parameters this rank holds
  double expert_params = 0;                     // of those, its MoE experts' (state sharded over expert_dp)
  double slots = 0;                             // micro-batches in flight at the peak
  double checkpoint_buffers = 0;                // host bytes of checkpoint.async_save's copies (0 without)
};

// Rank 0 prints every rank's figures (MiB, bytes per parameter beside Megatron's figure for
// dtype and the optimizer -- with MoE experts the mean of the dense parameters' figure over dp and
// the experts' over expert_dp, weighted by this rank's counts -- activations per layer beside `formula`, Korthikanti et
// al.'s bytes for am: 0 when it does not apply) and, when json_path is not empty, writes them in bytes to that JSON
// file (log.memory_file; docs/DESIGN.md "Memory report": written to a temporary name and renamed, so a reader never
// sees half a file). Collective over topo's world. Returns, on rank 0, every rank's figures in rank
// order (memory_figure_names() per rank; empty elsewhere).
std::vector<double> print_memory_report(const MemoryFigures& mf, const ActivationModel& am, double formula,
                                        const std::string& dtype, bool distributed, const Topology& topo,
                                        const std::string& json_path = "");

}  // namespace trident
