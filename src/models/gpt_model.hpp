// GPT-2 (DESIGN.md): learned absolute positions, pre-LayerNorm layers (eps from the deck),
// GELU (tanh), tied input/output word embeddings, causal attention, init normal(0, std) with the
// output projections (attention proj, fc2) scaled by 1/sqrt(2 * num_layers).
// Tensor parallel as Megatron: vocabulary-parallel word embedding (rows of the padded
// vocabulary split over TP) and vocabulary-parallel cross-entropy on the tied LM head, so the
// full logits never meet on one rank; transformer layers split by heads and MLP columns;
// optional sequence parallelism outside the tensor-parallel regions. Padded logits are masked,
// so neither losses nor gradients depend on the padding or on tp. Checkpoints store the
// unpadded, unsharded [vocab_size, C].
// The same class assembles BERT's encoder (GptConfig::bert): the embeddings gain token types,
// the layers attend bidirectionally under the micro-batch's padding mask, and BERT's heads
// (models/bert_head) replace the LM head; pipelining, recomputation, sequence parallelism and
// mixed precision are shared.
// It also assembles T5 (GptConfig::t5, Megatron's encoder-decoder): one global layer index
// runs over num_layers encoder layers (bidirectional under the encoder's padding mask) and then
// decoder_layers decoder layers (causal self-attention plus cross-attention over the encoder
// output); the encoder ends in its own final LayerNorm, whose output every decoder layer reads;
// word and position embeddings are shared by the encoder, the decoder and the LM head, which
// adds a vocabulary-parallel bias. The loss is the mean cross-entropy over the decoder targets of
// a micro-batch (padding excluded).
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "layers/param_store.hpp"
#include "layers/transformer_layer.hpp"
#include "models/bert_head.hpp"
#include "models/micro_batch.hpp"

namespace trident {

struct GptConfig {
  std::int64_t num_layers = 0, hidden = 0, heads = 0, ffn = 0, seq_length = 0, max_positions = 0;
  std::int64_t vocab_size = 0, padded_vocab = 0;
  float ln_eps = 1e-5f, init_std = 0.02f;
  float hidden_dropout = 0.f, attention_dropout = 0.f;
  // Activation recomputation (Megatron's --recompute-granularity / -method / -num-layers):
  // selective keeps everything but the core-attention probabilities, recomputed in backward;
  // full keeps only the inputs of groups of layers and re-runs their forward pass before their
  // backward pass: method uniform groups each chunk's layers by recompute_num_layers, method
  // block recomputes the first recompute_num_layers layers of each chunk one by one and keeps
  // the rest.
  enum class Recompute { None, Selective, Full } recompute = Recompute::None;
  bool recompute_block = false;  // method: false = uniform, true = block
  std::int64_t recompute_num_layers = 1;
  // Parameters and GEMM-feeding activations in fp32, bf16 or fp16 (mixed precision; the
  // residual stream, LayerNorm statistics, softmax, cross-entropy and gradients stay fp32).
  DType dt = DType::F32;
  bool flash_attention = false;  // fused attention kernel (no (T, T) probabilities stored)
  // BERT (pretrain_bert): bidirectional layers under the micro-batch's padding mask,
  // token-type embeddings, and BERT's heads (models/bert_head) instead of GPT's LM head.
  bool bert = false;
  bool binary_head = true;         // BERT: the sentence-order head
  std::int64_t num_token_types = 2;
  // T5 (pretrain_t5): num_layers is the encoder's, seq_length the encoder's sequence length.
  bool t5 = false;
  std::int64_t decoder_layers = 0, decoder_seq_length = 0;
  // Layers of the global index (encoder and decoder for T5).
  std::int64_t total_layers() const { return num_layers + (t5 ? decoder_layers : 0); }
};

// The part of the model one pipeline stage (or model chunk) holds: layers
// [first_layer, first_layer + num_layers), the embeddings when `pre`, the final LayerNorm, the
// tied LM head and the loss when `post`. A stage with `post` but not `pre` keeps a copy of the
// word embeddings, tied to the first stage's through the embedding group.
struct GptStage {
  std::int64_t first_layer = 0, num_layers = -1;  // -1: every layer
  bool pre = true, post = true;
};

class GptModel {
 public:
  // micro_batch: B of every forward call. tp: the tensor-parallel group (nullptr comm: tp = 1).
  GptModel(const GptConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp = {},
           const GptStage& stage = {});

  // Forward over tokens (B*T) with targets (B*T), no dropout; returns the SUM of the token
  // losses of the first `samples` samples (all B when negative). (GPT)
  double forward(const IntView& tokens, const IntView& targets, std::int64_t samples = -1);
  // Forward + backward with dropout drawn from `rng`; gradients of (dscale * sum of token
  // losses) are ACCUMULATED into the store's gradient buffer. Returns the sum of token losses.
  double forward_backward(const IntView& tokens, const IntView& targets, float dscale,
                          const DropoutStreams& rng = {});
  // The same for any micro-batch (BERT: returns mlm + sop, the means of the micro-batch, and
  // the gradient is that of dscale * (mlm + sop)).
  double forward(const MicroBatch& mb, std::int64_t samples = -1);
  double forward_backward(const MicroBatch& mb, float dscale, const DropoutStreams& rng = {});
  // BERT: the MLM and sentence-order losses summed over the micro-batches run since the last
  // call (the sum of the returned values split in its two parts); resets them. T5: the LM
  // losses in the mlm fields.
  BertLosses take_bert_losses();

  // ---- pipeline pieces, one micro-batch at a time; `slot` selects the activation set (one per
  // micro-batch in flight). Forward of this stage: reads tokens (pre) or `input` (R, C) from
  // the previous stage; on the last stage computes the loss and returns the sum of token losses
  // (of the first `samples` samples when not training), and when training also the gradient at
  // the stage output (kept in the slot for stage_backward). Returns 0 on other stages.
  double stage_forward(int slot, const MicroBatch& mb, const FloatView& input, bool training, float dscale,
                       const DropoutStreams& rng, std::int64_t samples = -1);
  // (R, C): what this stage sends to the next after stage_forward(slot)
  const FloatView& stage_output(int slot) const;
  // Backward of this stage for the slot's micro-batch; grad_output (R, C) comes from the next
  // stage (ignored on the last stage). Leaves d(stage input) in input_grad() (sent to the
  // previous stage when not pre).
  void stage_backward(int slot, const FloatView& grad_output);
  // Called with the global layer index as soon as a layer's parameter gradients are final, i.e.
  // after its backward pass for the last micro-batch of the iteration (the runner sets
  // final_backward for that one): the data-parallel reduction of that layer can start while
  // the earlier layers still run backward (Megatron's overlap_grad_reduce).
  std::function<void(std::int64_t)> on_layer_grads_ready;
  bool final_backward = false;
  const FloatView& input_grad() const { return dres_; }
  // Floats of one pipeline message (the stage output sent forward, its gradient sent back):
  // (R, C); T5: (R_d + R, C), the hidden states then the encoder output, at every boundary.
  std::int64_t activation_size() const { return message_size_; }
  const GptStage& stage() const { return stage_; }
  ParamId word_embeddings() const { return wte_; }
  ParamId position_embeddings() const { return wpe_; }
  // T5: whether this chunk computes the encoder output and the decoder's embeddings.
  bool starts_decoder() const { return dec_start_ >= 0; }

  const GptConfig& config() const { return cfg_; }
  // Bytes of activations this chunk keeps for one micro-batch in flight (measured from the
  // allocated sets), and of the workspaces shared by all micro-batches.
  std::int64_t activation_bytes_per_slot() const;
  std::int64_t workspace_bytes() const;
  // Bytes the transformer layers keep per micro-batch (the kept sets and the outputs of
  // recomputed segments), divided by the number of layers: what Korthikanti et al. count.
  double layer_activation_bytes() const;
  int num_slots() const { return static_cast<int>(slots_.size()); }
  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers_.size()); }
  std::int64_t micro_batch() const { return B_; }
  // Model FLOPs per step, Megatron's formula without recomputation:
  // 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) with V the padded vocabulary; T5: the same count
  // of GEMM FLOPs for the encoder, the decoder (with cross-attention) and the LM head.
  double flops_per_step(std::int64_t tokens_batch) const;

 private:
  struct Slot {
    FloatView input;      // (R, C) stage input: the embeddings (pre) or what the previous stage sent
    FloatView head_grad;  // (R, C) gradient at the last layer's output (post)
    IntView tokens;       // (BT) tokens, for the embedding backward (pre)
    IntView types;        // (BT) token types (BERT, pre)
    IntView padding;      // (BT) the micro-batch's padding mask (BERT, T5's encoder): the layers' key mask
    // T5: the decoder's tokens (for the embedding backward), its embedded input (R_d, C), the
    // encoder output (R, C: final LayerNorm output, with its statistics) and its gradient
    IntView dec_tokens;
    FloatView dec_input, enc_mean, enc_rstd, denc;
    Act enc_out;
    FloatView send;  // T5, not the last stage: the message sent forward (activation_size())
    DropoutStreams rng;
    std::vector<LayerActivations> acts;  // per layer; empty for layers under full recomputation
    std::vector<FloatView> seg_out;      // per segment: output of a recomputed segment (R, C)
  };
  // Consecutive layers whose activations are kept (one layer, recompute false) or recomputed
  // from the segment's input (recompute true).
  struct Segment {
    std::int64_t first = 0, count = 1;
    bool recompute = false;
  };
  // T5: 1 for the decoder layers, 0 otherwise (local layer index).
  int part(std::int64_t l) const { return cfg_.t5 && stage_.first_layer + l >= cfg_.num_layers ? 1 : 0; }
  // Local index of the first decoder layer when this chunk starts the decoder (T5), else -1.
  std::int64_t decoder_start() const { return dec_start_; }
  std::int64_t rows_of(int part) const { return part ? dec_rows_ : rows_; }
  std::int64_t local_rows_of(int part) const { return part ? dec_local_rows_ : local_rows_; }
  Slot& slot(int i);
  // The activation set layer l uses for the slot (the workspace for recomputed layers, with
  // the segment's last layer writing into the slot's seg_out).
  LayerActivations activations(Slot& s, std::int64_t l);
  FloatView segment_input(const Slot& s, std::int64_t seg) const;
  FloatView chunk_input(const Slot& s) const;  // the first layer's input (a view of s.input)
  FloatView layer_output(const Slot& s, std::int64_t l) const;
  DropoutSpec embedding_dropout(const DropoutStreams& rng) const;
  // Word + position (+ token type) embeddings of tokens (T positions per sample) into out (R, C);
  // `which` keys the dropout (0 the encoder's or GPT's / BERT's, 1 T5's decoder's).
  void embed(const FloatView& out, const IntView& tokens, const IntView& types, std::int64_t T,
             const DropoutStreams& rng, bool training, int which);
  void embed_backward(const FloatView& dout, const IntView& tokens, const IntView& types, std::int64_t T,
                      const DropoutStreams& rng, int which);
  void run_layer_forward(Slot& s, std::int64_t l, const FloatView& x, LayerActivations& a);
  double head(int slot, const MicroBatch& mb, bool training, float dscale, std::int64_t samples);

  GptConfig cfg_;
  ParamStore* store_;
  TensorParallel tp_;
  GptStage stage_;
  std::deque<Slot> slots_;
  std::int64_t B_, rows_, local_rows_, vocab_local_, vocab_start_;
  std::int64_t dec_rows_ = 0, dec_local_rows_ = 0, dec_start_ = -1, message_size_ = 0;
  bool in_dec_ = false, out_dec_ = false;  // T5: messages in / out carry the encoder output
  ParamId wte_ = -1, wpe_ = -1, tte_ = -1, lm_bias_ = -1;
  LayerNorm enc_lnf_;  // T5: the encoder's final LayerNorm (on the chunk that starts the decoder)
  std::unique_ptr<BertHead> bert_head_;
  BertLosses bert_losses_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::vector<Segment> segments_;
  std::vector<std::int64_t> segment_of_;       // layer -> segment
  // shared by recomputed layers (one per position in a segment), per part
  std::vector<LayerActivations> workspace_[2];
  LayerNorm lnf_;
  std::unique_ptr<TransformerScratch> scratch_[2];  // per part (T5: encoder, decoder shapes)
  FloatView word_, lnf_mean_, lnf_rstd_, logits_, losses_, dres_, dlnf_, dhead_;
  Act lnf_out_, head_in_;  // final LayerNorm output (R, C) and the LM head's input (BT, C)
  HalfView dlogits16_;     // 16-bit copy of the logits' gradient for the head GEMMs
  FloatView ce_scratch_;
};

}  // namespace trident
