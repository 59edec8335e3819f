// The shared transformer stack of every model family (docs/DESIGN.md "Architecture"):
// embeddings -> layers -> final LayerNorm -> a family's head (models/model_head). What kind of
// stack it is comes from TransformerConfig's layer specs, never from a family flag:
//   - learned absolute positions, pre-LayerNorm layers (eps from the deck), GELU (tanh),
//     word embeddings tied to the head, init normal(0, std) with the output projections
//     (attention proj, fc2) scaled by 1/sqrt(2 * total layers);
//   - the first stack's layers are causal (GPT) or bidirectional under the micro-batch's padding
//     mask (BERT, T5's encoder); token-type embeddings when num_token_types > 0 (BERT);
//   - an encoder-decoder (decoder_layers > 0, T5, Megatron's layout) runs one global layer index
//     over the encoder's num_layers layers and then the decoder's (causal self-attention plus
//     cross-attention over the encoder output); the encoder ends in its own final LayerNorm,
//     whose output every decoder layer reads; word and position embeddings are shared by the
//     encoder, the decoder and the head.
// Tensor parallel as Megatron: vocabulary-parallel word embedding (rows of the padded
// vocabulary split over TP), layers split by heads and MLP columns, optional sequence
// parallelism outside the tensor-parallel regions; checkpoints store the unpadded, unsharded
// [vocab_size, C]. Pipeline parallel: a chunk holds one ModelStage of the layers, with slots of
// activations (one per micro-batch in flight) and recomputation segments.
// The families (gpt_model, bert_model, t5_model) derive from this class, fill the config and
// attach their head; make_model (model_factory) builds one by ModelFamily.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/layer_modules.hpp"
#include "layers/param_store.hpp"
#include "layers/moe_mlp.hpp"
#include "layers/transformer_layer.hpp"
#include "models/micro_batch.hpp"
#include "models/model_head.hpp"
#include "models/transformer_config.hpp"

namespace trident {

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  LanguageModel(const LanguageModel&) = delete;
  LanguageModel& operator=(const LanguageModel&) = delete;

  // Forward over tokens (B*T) with targets (B*T), no dropout; returns the head's loss (GPT: the
  // SUM of the token losses of the first `samples` samples, all B when negative).
  double forward(const IntView& tokens, const IntView& targets, std::int64_t samples = -1);
  // Forward + backward with dropout drawn from `rng`; gradients of (dscale * sum of token
  // losses) are ACCUMULATED into the store's gradient buffer. Returns the sum of token losses.
  double forward_backward(const IntView& tokens, const IntView& targets, float dscale, const DropoutStreams& rng = {});
  // The same for any micro-batch (BERT: returns mlm + sop, the means of the micro-batch, and
  // the gradient is that of dscale * (mlm + sop); T5: the mean over the decoder targets).
  double forward(const MicroBatch& mb, std::int64_t samples = -1);
  double forward_backward(const MicroBatch& mb, float dscale, const DropoutStreams& rng = {});
  // The head's loss parts summed over the micro-batches run since the last call (BERT: the
  // returned values split into masked LM and sentence order; T5: the LM loss); resets them.
  // Zero on chunks without the head.
  LossParts take_loss_parts() { return head_ ? head_->take_loss_parts() : LossParts{}; }
  // the training losses the head kept on the device since the last call (ModelHead)
  double take_device_loss() { return head_ ? head_->take_device_loss() : 0.0; }
  // Device buffers for every micro-batch field the model reads (tokens and targets always;
  // token types, the padding mask, the decoder's tokens and the family's head inputs as the
  // config needs them), on any chunk: every loading stage receives the whole micro-batch.
  MicroBatch allocate_micro_batch() const;
  // Whether this chunk reads the micro-batch (the embeddings, the head, or a padding mask).
  bool reads_micro_batch() const {
    return stage_.pre || stage_.post || cfg_.padding_mask() || cfg_.encoder_decoder() || cfg_.packed();
  }

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
  const ModelStage& stage() const { return stage_; }
  ParamId word_embeddings() const { return wte_; }
  // The head's weights (post stages): the tied word embeddings, or the untied output layer.
  ParamId output_weights() const { return out_ >= 0 ? out_ : wte_; }
  ParamId position_embeddings() const { return wpe_; }
  // Encoder-decoder: whether this chunk computes the encoder output and the decoder's embeddings.
  bool starts_decoder() const { return dec_start_ >= 0; }

  const TransformerConfig& config() const { return cfg_; }
  // The pieces inference runs itself (models/gpt_generator): this chunk's layers (local index),
  // the final LayerNorm (post stages) and the parameters.
  const TransformerLayer& layer(std::int64_t l) const { return *layers_.at(static_cast<size_t>(l)); }
  const Norm& final_norm() const { return lnf_; }
  const ParamStore& params() const { return *store_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // This rank's rows [vocab_start, vocab_start + vocab_local) of the padded vocabulary.
  std::int64_t vocab_local() const { return vocab_local_; }
  std::int64_t vocab_start() const { return vocab_start_; }
  // Bytes of activations this chunk keeps for one micro-batch in flight (measured from the
  // allocated sets), and of the workspaces shared by all micro-batches.
  std::int64_t activation_bytes_per_slot() const;
  std::int64_t workspace_bytes() const;
  // Bytes the transformer layers keep per micro-batch (the kept sets and the outputs of
  // recomputed segments), divided by the number of layers: what Korthikanti et al. count.
  double layer_activation_bytes() const;
  int num_slots() const { return static_cast<int>(slots_.size()); }
  std::int64_t num_layers() const { return static_cast<std::int64_t>(layers_.size()); }
  // the first layer's core-attention entry and why (TransformerLayer::attention_summary); "" without layers
  std::string attention_summary() const {
    return layers_.empty() ? std::string() : layers_.front()->attention_summary();
  }
  std::int64_t micro_batch() const { return B_; }
  // Model FLOPs per step, Megatron's formula without recomputation: GPT-2's layer
  // 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) with V the padded vocabulary; another MLP width, a
  // gated MLP or grouped-query attention num_floating_point_operations' general form (language_model.cpp);
  // encoder-decoder: the same count of GEMM FLOPs for the encoder, the decoder (with
  // cross-attention) and the LM head. flops_formula() names the one that applies.
  // seq_length: the sequences' length when the model holds part of each (context parallelism; 0: its own)
  double flops_per_step(std::int64_t tokens_batch, std::int64_t seq_length = 0) const;
  std::string flops_formula() const;
  // The chunk's MoE state (null without MoE layers): the aux losses' gradient scale the trainer
  // sets, and the losses and loads its layers collect over an iteration.
  MoeState* moe_state() const { return moe_state_.get(); }

 protected:
  // micro_batch: B of every forward call. tp: the tensor-parallel group (nullptr comm: tp = 1).
  // Declares the embeddings, this stage's layers and final LayerNorms; a family then attaches
  // its head (on the last stage).
  LanguageModel(const TransformerConfig& cfg, ParamStore& store, std::int64_t micro_batch, const TensorParallel& tp,
                const ModelStage& stage);
  // Takes the head (post stages) and allocates the final LayerNorm's buffers around it.
  void attach_head(std::unique_ptr<ModelHead> head);
  // The micro-batch fields the family's head reads beyond the targets (BERT: sentence order).
  virtual void allocate_head_inputs(MicroBatch& mb) const {}
  ParamStore& store() { return *store_; }
  // Rows of the head's input (BT): the decoder's for an encoder-decoder.
  std::int64_t head_rows() const { return cfg_.encoder_decoder() ? dec_rows_ : rows_; }

 private:
  struct Slot {
    FloatView input;               // (R, C) stage input: the embeddings (pre) or what the previous stage sent
    FloatView head_grad;           // (R, C) gradient at the last layer's output (post)
    IntView tokens;                // (BT) tokens, for the embedding backward (pre)
    IntView types;                 // (BT) token types (num_token_types > 0, pre)
    IntView padding;               // (BT) the micro-batch's padding mask (padding-masked layers): their key mask
    IntView padding_len;           // (B) device kernels: the same as lengths (MicroBatch::padding_len)
    bool padding_lengths = false;  // whether the micro-batch held in this slot came with them
    IntView positions, doc_start;  // (BT) packed documents: the micro-batch's (kept until the backward pass)
    // (BT) device kernels: the micro-batch's row orders (MicroBatch::token_order) and whether the
    // micro-batch held in this slot came with them
    IntView token_order, position_order;
    bool token_ordered = false, position_ordered = false;
    // Encoder-decoder: the decoder's tokens (for the embedding backward), its embedded input (R_d, C), the
    // encoder output (R, C: final LayerNorm output, with its statistics) and its gradient
    IntView dec_tokens;
    FloatView dec_input, enc_mean, enc_rstd, denc;
    Act enc_out;
    FloatView send;  // encoder-decoder, not the last stage: the message sent forward (activation_size())
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
  // 1 for the decoder layers of an encoder-decoder, 0 otherwise (local layer index).
  int part(std::int64_t l) const { return cfg_.encoder_decoder() && stage_.first_layer + l >= cfg_.num_layers ? 1 : 0; }
  // Local index of the first decoder layer when this chunk starts the decoder, else -1.
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
  // `which` keys the dropout (0 the first stack's, 1 the decoder's).
  // positions (B * T): the tokens' positions for learned position embeddings (packed
  // documents); empty: row % T
  void embed(const FloatView& out, const IntView& tokens, const IntView& types, std::int64_t T,
             const DropoutStreams& rng, bool training, int which, const IntView& positions = {});
  // token_order, position_order: the rows' orders of the device kernels (Slot::token_order)
  void embed_backward(const FloatView& dout, const IntView& tokens, const IntView& types, std::int64_t T,
                      const DropoutStreams& rng, int which, const IntView& positions = {},
                      const IntView& token_order = {}, const IntView& position_order = {});
  void run_layer_forward(Slot& s, std::int64_t l, const FloatView& x, LayerActivations& a);
  // Final LayerNorm, the head and its backward into the slot's head_grad.
  double run_head(int slot, const MicroBatch& mb, bool training, float dscale, std::int64_t samples);

  TransformerConfig cfg_;
  ParamStore* store_;
  TensorParallel tp_;
  ModelStage stage_;
  std::deque<Slot> slots_;
  std::int64_t B_, rows_, local_rows_, vocab_local_, vocab_start_;
  std::int64_t dec_rows_ = 0, dec_local_rows_ = 0, dec_start_ = -1, message_size_ = 0;
  bool in_dec_ = false, out_dec_ = false;  // encoder-decoder: messages in / out carry the encoder output
  ParamId wte_ = -1, wpe_ = -1, tte_ = -1, out_ = -1;
  Norm enc_lnf_;                     // the encoder's final LayerNorm (on the chunk that starts the decoder)
  std::unique_ptr<ModelHead> head_;  // post stages
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::vector<Segment> segments_;
  std::vector<std::int64_t> segment_of_;  // layer -> segment
  // shared by recomputed layers (one per position in a segment), per part
  std::vector<LayerActivations> workspace_[2];
  std::shared_ptr<MoeState> moe_state_;  // MoE layers: their losses and loads (null: none)
  Norm lnf_;
  std::unique_ptr<TransformerScratch> scratch_[2];  // per part (encoder, decoder shapes)
  FloatView word_;                 // (BT, C) word-embedding lookups (the largest of encoder and decoder)
  FloatView lnf_mean_, lnf_rstd_;  // (R) final LayerNorm statistics
  FloatView dres_;                 // (max(R, R_d) C, or a pipeline message) gradient at the residual stream
  FloatView dlnf_;                 // (R, C) gradient at the final LayerNorm's output
  FloatView dhead_;                // (BT, C) gradient at the head's input (dlnf_ itself when the head allows)
  Act lnf_out_, head_in_;          // final LayerNorm output (R, C) and the head's input (BT, C)
};

}  // namespace trident
