// Pre-LayerNorm transformer layer (GPT-2), tensor- and sequence-parallel (Megatron):
//   x2 = x + dropout(proj(attention(LN1(x))))      x3 = x2 + dropout(fc2(gelu(fc1(LN2(x2)))))
// A decoder layer (T5, TransformerShape::Tk > 0) adds cross-attention over the encoder output
// e between the two (Megatron's inter-attention):
//   x2' = x2 + dropout(cproj(attention(q(LNx(x2)), kv(e))))   and the MLP then reads x2'.
// qkv and fc1 are column-parallel, proj and fc2 row-parallel; this rank computes query heads
// [r*nh/tp, (r+1)*nh/tp) and key/value groups [r*ng/tp, (r+1)*ng/tp) (grouped-query attention,
// ng = ModelArch::groups(); qkv's rows on a rank: [q_r (nh/tp d); k_r (ng/tp d); v_r (ng/tp d)]
// with d = ModelArch::head_dim()). With qk_layernorm, q and k are normalised per head before
// the rotary turn. Outside the tensor-parallel region (LayerNorm, dropout, residual) a
// rank holds all B*T rows, or rows/tp of them with sequence parallelism.
// Keeps, per instance, the activations its backward needs (no autograd tape).
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>

#include "layers/attention_core.hpp"
#include "layers/context_parallel.hpp"
#include "layers/layer_modules.hpp"
#include "layers/mlp.hpp"
#include "layers/parallel_linear.hpp"
#include "ops/attention.hpp"

namespace trident {

struct MoeState;

// One stack's layers: the architecture (ModelArch, as the model configuration holds it) and the
// stack's shapes and run-time choices.
struct TransformerShape : ModelArch {
  std::int64_t B = 0, T = 0;       // micro-batch, sequence (global sizes)
  std::int64_t max_positions = 0;  // the longest sequence of the model (rotary tables, generation)
  float out_init_std = 0.f;        // std of the output projections
  TensorParallel tp;
  // Storage of the parameters and of the activations that feed GEMMs (fp32, or bf16 / fp16
  // words for mixed precision); the residual stream, statistics and gradients stay fp32
  // (Megatron's --fp32-residual-connection). The core attention runs the fused kernel
  // (ops/flash_attention: no (T, T) probabilities kept) under ModelArch::flash_attention.
  DType dt = DType::F32;
  // Causal self-attention (GPT, the T5 decoder) or bidirectional with a key-padding mask given
  // per micro-batch (BERT, the T5 encoder).
  bool causal = true;
  // Cross-attention over an encoder output of Tk positions per sample (T5's decoder); 0: none.
  // The fused attention kernel serves self-attention only; cross-attention takes the GEMM path.
  std::int64_t Tk = 0;
  // LoRA adapters (rank 0: none) on the projections named in lora_targets (qkv, proj, fc1, fc2,
  // cross_q, cross_kv, cross_proj).
  LoraSpec lora{};
  std::set<std::string> lora_targets{};
  // MoE layers (moe.layer(index)): the chunk's losses, loads and the aux losses' gradient scale
  std::shared_ptr<MoeState> moe_state{};
  LoraSpec lora_for(const char* projection) const { return lora_targets.count(projection) ? lora : LoraSpec{}; }
  std::int64_t rows() const { return B * T; }
  std::int64_t local_rows() const { return tp.sequence_parallel ? B * T / tp.size() : B * T; }
  std::int64_t enc_rows() const { return B * Tk; }
  std::int64_t enc_local_rows() const { return tp.sequence_parallel ? B * Tk / tp.size() : B * Tk; }
};

// Dropout streams of one micro-batch (Megatron's convention: `shared` is the same on every TP
// rank and serves regions where TP ranks hold identical data; `tp_local` differs per TP rank
// and serves the tensor-parallel region and, with sequence parallelism, the row-split region).
struct DropoutStreams {
  std::uint64_t step = 0;
  std::uint64_t shared = 0, tp_local = 0;
  bool training = false;  // no dropout when false (evaluation)
};

// What one layer keeps from its forward pass for its backward pass, for one micro-batch
// (R = local rows, BT = all rows, Q_l = nh d/tp, W_l = (nh + 2 ng) d/tp, F_l = F/tp,
// A = B x nh/tp x T x T). The owner
// (the model) decides where it lives: one set per layer and micro-batch in flight, or, for
// layers under full recomputation, a workspace shared by the micro-batches whose forward pass
// is re-run just before their backward pass. Dropout masks are never stored: they are
// regenerated from the keys in `rng`.
// Per-token facts of a micro-batch (each B * T, global rows; empty: the default) that a layer
// reads in its forward pass and again in its backward pass (the owner keeps them alive):
//   key_valid  the padding mask (bidirectional layers: keys with 0 are not attended to)
//   doc_start  packed documents (causal layers): the first position of each token's document,
//              the first key it attends to (Megatron's --reset-attention-mask)
//   positions  packed documents: each token's position within its document, for the rotary
//              embedding (Megatron's --reset-position-ids)
//   key_len    (B) device kernels: key_valid as one length per sample, where each sample's valid
//              keys are a prefix (AttentionMask::key_len); empty otherwise
struct TokenInfo {
  IntView key_valid, doc_start, positions, key_len;
};

struct LayerActivations {
  DropoutStreams rng;
  AttentionMask mask;                   // the forward pass's (causal flag, key padding, document starts)
  IntView positions;                    // the forward pass's token positions (empty: row % T)
  Act ln1;                              // (R, C) LayerNorm output, input of qkv
  FloatView ln1_mean, ln1_rstd;         // (R), (R)
  Act qkv;                              // (BT, W_l)
  FloatView qk_x, qk_mean, qk_rstd;     // q/k norms: their fp32 inputs (BT, (nh + ng) d/tp), statistics
  std::shared_ptr<AttentionKept> core;  // the core-attention slot's (unfused: the probabilities; fused: lse)
  Act atty;                             // (BT, Q_l): input of proj
  FloatView res2;                       // (R, C): residual after attention, input of LN2 (fp32)
  // cross-attention (decoder layers; E = B * Tk encoder rows, R_e = E or E/tp with SP,
  // A_x = B x nh/tp x T x Tk)
  Act enc;                       // (R_e, C) the encoder output (a handle: the model keeps it)
  IntView enc_valid;             // (B * Tk) its padding mask (a handle)
  Act lnx;                       // (R, C) LayerNorm output, input of the query projection
  FloatView lnx_mean, lnx_rstd;  // (R), (R)
  Act cq, ckv;                   // (BT, C_l) queries, (E, 2 C_l) keys | values
  Act catt, catt_drop;           // (A_x) probabilities, after dropout
  Act catty;                     // (BT, C_l): input of the cross-attention projection
  FloatView res3;                // (R, C): residual after cross-attention, input of LN2
  Act ln2;                       // (R, C)
  FloatView ln2_mean, ln2_rstd;  // (R), (R)
  std::shared_ptr<MlpKept> mlp;  // the MLP module's (dense: fc1's output (BT, blocks F_l), fc2's input (BT, F_l))
  FloatView out;                 // (R, C): layer output (fp32 residual stream)
  // false under selective recomputation with the unfused core attention: the cross-attention's
  // catt / catt_drop are the shared workspace, recomputed in the backward pass from cq and ckv
  // (Megatron's core-attention recomputation).
  bool attention_kept = true;
  // Bytes held by this set.
  std::int64_t bytes() const;
};

// Scratch shared by all layers of a model chunk (sized for one layer): backward temporaries,
// the forward branch output, the sequence-parallel gather buffer and, under selective
// recomputation, the attention probabilities.
struct TransformerScratch {
  TransformerScratch(const TransformerShape& s, bool selective);
  bool selective = false;  // selective recomputation (prepare_scratch)
  // backward temporaries, fp32: (R,C) (BT,W_l) (BT,Q_l) (R,C); in the 16-bit forward pass dqkv
  // and datty also receive the fp32 GEMM outputs before rounding
  FloatView dln, dqkv, datty, dbranch;
  // the MLP modules' (dense: d fc1-out, d act-out), one per kind of module (prepare_scratch)
  std::map<std::string, std::shared_ptr<MlpScratch>> mlp;
  // the core-attention slot's, one per entry (prepare_scratch)
  std::map<std::string, std::shared_ptr<AttentionCoreScratch>> core;
  // q/k norms: the normalised heads' values (the activations' type) and fp32 gradients
  Act qk_out;
  FloatView qk_dout, qk_dx;
  // cross-attention (decoder layers): (BT, C/tp) (E, 2C/tp) (R_e, C), the gathered encoder
  // output (E, C) under SP and, under selective recomputation, the probabilities (A_x)
  FloatView dcq, dckv, denc;
  Act gathered_enc, catt, catt_drop;
  FloatView datt;    // attention scratch (B, nh/tp, T, max(T, Tk))
  FloatView branch;  // (R, C): proj / fc2 output before dropout
  Act gathered;      // (BT, C) all-gathered LayerNorm output (SP)
  // 16-bit path: fp32 probabilities for the softmax backward, and 16-bit copies of gradients
  // that enter GEMMs (rounded as Megatron's bf16 gradients are)
  FloatView att32;  // (B, nh/tp, T, max(T, Tk))
  HalfView dy16;    // (max(BT, E), max(W_l, F/tp, C))
  HalfView ds16;    // (B, nh/tp, T, max(T, Tk))
  std::int64_t bytes() const;
  // The GEMM attention's view of the above (fp32 scores in datt, the fp32 output in datty).
  AttentionScratch attention() const { return {datt, att32, datty, dy16, ds16}; }
};

class TransformerLayer {
 public:
  TransformerLayer(ParamStore& store, const std::string& prefix, std::int64_t index, const TransformerShape& s);

  // Adds this layer's MLP scratch to the chunk's s (one per kind of module).
  void prepare_scratch(TransformerScratch& s) const;
  // Allocates a set of activations for this layer; with keep_attention false, att and
  // att_drop are the scratch's (selective recomputation).
  LayerActivations make_activations(const TransformerScratch& s, bool keep_attention) const;

  // x (R, C) -> a.out (R, C). x must stay alive (or be recreated) until the backward pass.
  // tok: the micro-batch's padding mask (bidirectional layers), document starts and positions
  // (packed sequences); they must stay alive until the backward pass. Decoder layers: enc
  // (R_e, C) is the encoder output and enc_valid (B * Tk) its padding mask (the cross-attention's
  // key mask); both must stay alive until the backward pass.
  void forward(const FloatView& x, const DropoutStreams& rng, LayerActivations& a, TransformerScratch& s,
               const TokenInfo& tok = {}, const Act& enc = {}, const IntView& enc_valid = {});
  // dres (R, C): on entry the gradient w.r.t. this layer's output, on exit w.r.t. its input x.
  // Decoder layers ADD the gradient w.r.t. the encoder output to denc (R_e, C).
  void backward(const FloatView& dres, const FloatView& x, LayerActivations& a, TransformerScratch& s,
                const FloatView& denc = {});
  bool cross() const { return s_.Tk > 0; }
  // the core attention's entry and why (attention_core_summary), for the run's banner
  std::string attention_summary() const;

  // Inference with a key-value cache (generation; a causal self-attention layer, fp32, no
  // dropout, no sequence parallelism): x (R, C) -> x (R, C) in place for R = B n rows, B samples
  // of n new tokens each at `positions` (R). Their keys and values go into `cache` (B, L, 2 ng d/tp:
  // the key/value groups only; kv_cache_store), and the queries attend over the cache as `as` and
  // `mask` say (as.Tk keys, as.kv_stride = L). w: workspaces for R rows.
  struct InferenceScratch {
    FloatView h, mean, rstd, qkv, q, att, y, out, fc,
        act;                                   // (R,C) (R) (R) (R,W_l) (R,Q_l) probs (R,Q_l) (R,C) (R,F/tp) x2
    FloatView qk_x, qk_mean, qk_rstd, qk_out;  // q/k norms: (R, (nh + ng) d/tp), (R (nh + ng)/tp) x2, like qk_x
  };
  // this rank's widths: query channels (nh d/tp), key channels (ng d/tp), a row of qkv
  std::int64_t q_local() const { return s_.q_width() / s_.tp.size(); }
  std::int64_t kv_local() const { return s_.kv_width() / s_.tp.size(); }
  std::int64_t qkv_local() const { return q_local() + 2 * kv_local(); }
  const QkNorm& qk_norm() const { return qk_norm_; }
  // the core attention's shape for B samples of T queries (this rank's heads and groups)
  AttentionShape attention_shape(std::int64_t B, std::int64_t T) const;
  // enc_positions (R): the positions the rotary embedding turns by, when they differ from the
  // cache rows `positions` (packed documents: positions restart after an end-of-document token).
  void infer(const FloatView& x, const FloatView& cache, const IntView& positions, std::int64_t R, std::int64_t n,
             std::int64_t L, const AttentionShape& as, const AttentionMask& mask, const InferenceScratch& w,
             const IntView& enc_positions = {}) const;

 private:
  DropoutSpec spec(const DropoutStreams& rng, float p, std::uint64_t site, bool tp_region) const;
  // the core-attention slot's view of a's and s's buffers, and its scratch
  AttentionIo attention_io(const LayerActivations& a, const TransformerScratch& s) const;
  AttentionCoreScratch& core_scratch(TransformerScratch& s) const { return *s.core.at(core_->kind()); }
  AttentionShape cross_shape() const;
  void cross_forward(LayerActivations& a, TransformerScratch& s, const IntView& enc_valid);
  void cross_backward(const FloatView& dres, LayerActivations& a, TransformerScratch& s, const FloatView& denc);

  TransformerShape s_;
  std::int64_t index_;
  std::unique_ptr<AttentionCore> core_;          // the core-attention slot
  Norm norm1_, norm2_, normx_;                   // the normalisation slot
  std::shared_ptr<const PositionEncoding> pos_;  // the position slot (rotary: in the self-attention)
  QkNorm qk_norm_;                               // the q/k normalisation slot
  RopeLayout rope_layout(std::int64_t rows) const;
  // declared in this order: qkv, the MLP's input side, proj, the MLP's output side (mlp.hpp)
  ColumnParallelLinear qkv_;
  std::unique_ptr<MlpModule> mlp_;  // the MLP slot
  ColumnParallelLinear cq_, ckv_;
  RowParallelLinear proj_, cproj_;
};

}  // namespace trident
