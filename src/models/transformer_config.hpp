// The transformer configuration every model family is built from (docs/DESIGN.md
// "Architecture"): shapes, precision, recomputation, and the layer specs that say what kind of
// stack it is. No family flag lives here: a decoder-only causal stack is GPT's, a padding-masked
// stack with token types is BERT's encoder, an encoder followed by a causal, cross-attending
// decoder is T5's. The heads and losses belong to the family classes (gpt_model, bert_model,
// t5_model), whose set_spec fills these fields; the trainer reads the rest from the deck.
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include "common/half.hpp"
#include "common/model_arch.hpp"

namespace trident {

// What a layer attends to: earlier positions of its own sequence (causal), or every position of
// it that the micro-batch's padding mask marks real (bidirectional).
enum class MaskKind { Causal, Padding };

// One kind of transformer layer of a stack.
struct LayerSpec {
  MaskKind mask = MaskKind::Causal;
  bool cross_attention = false;  // attends to the encoder output too (T5's decoder)
};

// The architecture (ModelArch: the deck's model keys, taken whole) and the run's shapes.
struct TransformerConfig : ModelArch {
  // num_layers: the first stack's (the encoder's for an encoder-decoder); seq_length its sequence
  std::int64_t num_layers = 0, seq_length = 0, max_positions = 0;
  std::int64_t vocab_size = 0, padded_vocab = 0;  // padded: a multiple of make_vocab_size_divisible_by x tp
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
  // LoRA adapters (deck lora.*): rank 0 none; scale alpha / rank; the projections they adapt.
  std::int64_t lora_rank = 0;
  float lora_scale = 1.f;
  std::set<std::string> lora_targets;

  // The first stack's layers (GPT: causal; BERT and T5's encoder: padding-masked).
  LayerSpec layer;
  // Token-type (segment) embeddings added to the first stack's input; 0: none (BERT: 2).
  std::int64_t num_token_types = 0;
  // An encoder-decoder when decoder_layers > 0: decoder_layers layers of decoder_layer over
  // decoder_seq_length positions follow the encoder in one global layer index, the encoder ends
  // in its own final LayerNorm, and every decoder layer reads that encoder output.
  std::int64_t decoder_layers = 0, decoder_seq_length = 0;
  LayerSpec decoder_layer{MaskKind::Causal, true};

  // Document-aware packing (deck data.reset_position_ids, reset_attention_mask, eod_mask_loss;
  // GPT): the micro-batch brings each token's position (MicroBatch::positions) and its
  // document's first position (MicroBatch::doc_start), and the head's loss is the mean over the
  // micro-batch's counted targets. Not part of the architecture: a checkpoint trains on either way.
  bool reset_position_ids = false, reset_attention_mask = false, per_target_loss = false;

  bool encoder_decoder() const { return decoder_layers > 0; }
  bool packed() const { return reset_position_ids || reset_attention_mask; }
  bool padding_mask() const { return layer.mask == MaskKind::Padding; }
  // Layers of the global index (encoder and decoder of an encoder-decoder).
  std::int64_t total_layers() const { return num_layers + decoder_layers; }
};

// The checkpoint name prefix of global layer l's parameters: "model/layers/l", or for an
// encoder-decoder "model/encoder/layers/l" and "model/decoder/layers/(l - num_layers)"
// (docs/DESIGN.md "Checkpoints"). The one place these names are made.
inline std::string layer_param_prefix(const TransformerConfig& cfg, std::int64_t l) {
  if (!cfg.encoder_decoder()) return "model/layers/" + std::to_string(l);
  return l < cfg.num_layers ? "model/encoder/layers/" + std::to_string(l)
                            : "model/decoder/layers/" + std::to_string(l - cfg.num_layers);
}

// The part of the model one pipeline stage (or model chunk) holds: layers
// [first_layer, first_layer + num_layers) of the global index, the embeddings when `pre`, the
// final LayerNorm, the head and the loss when `post`. A stage with `post` but not `pre` keeps a
// copy of the word embeddings, tied to the first stage's through the embedding group.
struct ModelStage {
  std::int64_t first_layer = 0, num_layers = -1;  // -1: every layer
  bool pre = true, post = true;
};

}  // namespace trident
