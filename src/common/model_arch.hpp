// The architecture of a transformer stack as the deck's [model] section states it (docs/DESIGN.md
// "Architecture", Megatron-core's TransformerConfig): the one struct that carries every
// architecture key from the deck (io/deck's Deck::Model derives from it) through the model
// configuration (models/transformer_config's TransformerConfig derives from it) to each module
// of the layer (layers/transformer_layer's TransformerShape derives from it). A new key is one
// field here, its line in the deck's registry, and the module that reads it; nothing copies
// fields by hand.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace trident {

// A mixture of experts in the MLP slot (the deck's [moe]; Megatron-core's --num-experts and
// --moe-* flags; docs/DESIGN.md "Mixture of experts").
struct MoeArch {
  std::int64_t num_experts = 0;      // 0: every layer's MLP is dense
  std::int64_t router_topk = 2;      // experts per token
  std::int64_t ffn_hidden_size = 0;  // each expert's hidden width (0: the model's ffn_hidden_size)
  // which layers hold experts: "N" (global layer i when i % N == 0; "1": all) or a list of 0/1,
  // one per layer ("[1,0,1,1]")
  std::string layer_freq = "1";
  std::int64_t shared_expert_intermediate_size = 0;  // a dense MLP beside the experts (0: none)
  std::string router_score_function = "softmax";     // softmax | sigmoid
  bool router_pre_softmax = false;                   // softmax over all experts before the top-k
  double aux_loss_coeff = 0.0, z_loss_coeff = 0.0;
  double expert_capacity_factor = 0.0;      // 0: dropless
  std::string token_drop_policy = "probs";  // probs | position
  // aux-loss-free load balancing (DeepSeek-V3; Megatron's --moe-router-enable-expert-bias): a
  // per-expert bias added to the sigmoid scores for the top-k selection only, updated after every
  // iteration by rate x sign(mean load - load of the expert)
  bool router_enable_expert_bias = false;
  double router_bias_update_rate = 1e-3;
  // the MoE flags of each global layer (from layer_freq; resolved by the deck)
  std::vector<char> layers;
  bool on() const { return num_experts > 0; }
  bool layer(std::int64_t i) const {
    return on() && i >= 0 && i < static_cast<std::int64_t>(layers.size()) && layers[static_cast<size_t>(i)] != 0;
  }
};

struct ModelArch {
  std::int64_t hidden_size = 0, num_heads = 0;
  std::int64_t ffn_hidden_size = 0;  // deck 0: derived (4h)
  // Attention (Megatron's --num-query-groups, --kv-channels, --qk-layernorm): num_query_groups
  // key/value heads, each shared by num_heads / num_query_groups query heads (grouped-query
  // attention; 1: multi-query; the deck's 0 becomes num_heads, multi-head), kv_channels channels
  // per head (the deck's 0 becomes hidden_size / num_heads), and qk_layernorm a norm (of the
  // normalization slot) over each head's channels of the queries and keys, before rotary
  // positions (Qwen 3).
  std::int64_t num_query_groups = 0, kv_channels = 0;
  bool qk_layernorm = false;
  // the normalisation's epsilon (deck model.norm_epsilon, alias model.layernorm_epsilon) and the
  // std of the normal initialisation; doubles as the deck holds them, used in fp32 (eps(),
  // init_std())
  double norm_epsilon = 1e-5, init_method_std = 0.02;
  double hidden_dropout = 0.0, attention_dropout = 0.0;
  bool flash_attention = false;  // fused attention kernel (Megatron's --use-flash-attn)
  // Which library serves the fused attention on the device path (Megatron's --attention-backend):
  // auto (cuDNN's fused attention where the build has it and it can express the call, else
  // Trident's kernel), cudnn (cuDNN or an error), local (Trident's kernel). Host builds always run
  // Trident's kernel. Run-time only: it shapes no weight.
  std::string attention_backend = "auto";
  // The modules in the layer's slots (layers/layer_modules: each name one registry entry).
  std::string normalization = "LayerNorm";  // every norm of the stack (Megatron's --normalization)
  bool swiglu = false;                      // the MLP's activation: GELU, or SiLU-gated (Megatron's --swiglu)
  // Positions (Megatron's --position-embedding-type): learned_absolute (a table added to the
  // embeddings), rope (queries and keys turned in each layer) or none.
  std::string position_embedding_type = "learned_absolute";
  double rotary_base = 10000.0, rotary_percent = 1.0;  // rope: base of the frequencies, share of each head turned
  // Llama 3.1's frequency scaling (Megatron's --use-rope-scaling, --rope-scaling-factor; the other
  // three are Hugging Face's rope_scaling fields, Megatron's fixed values by default)
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  std::int64_t rope_original_max_position_embeddings = 8192;
  // Biases (Megatron's --disable-bias-linear, --add-qkv-bias): every linear of the layer has one
  // when add_bias_linear; without it only the qkv projection may keep its own (Qwen 2).
  bool add_bias_linear = true, add_qkv_bias = false;
  // The output layer: the word embeddings (tied, GPT-2) or its own vocabulary-parallel weight
  // model/output_layer/weight on the last stage (Megatron's --untie-embeddings-and-output-weights).
  bool untie_embeddings_and_output_weights = false;
  MoeArch moe;  // experts in the MLP slot of the layers moe.layer(i) names

  std::int64_t groups() const { return num_query_groups > 0 ? num_query_groups : num_heads; }
  std::int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_heads; }
  std::int64_t q_width() const { return num_heads * head_dim(); }  // query rows of qkv, proj's input
  std::int64_t kv_width() const { return groups() * head_dim(); }  // key (and value) rows of qkv
  std::int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool learned_positions() const { return position_embedding_type == "learned_absolute"; }

  const char* mlp_activation() const { return swiglu ? "swiglu" : "gelu"; }

  float eps() const { return static_cast<float>(norm_epsilon); }
  float init_std() const { return static_cast<float>(init_method_std); }
  float hidden_p() const { return static_cast<float>(hidden_dropout); }
  float attention_p() const { return static_cast<float>(attention_dropout); }
};

}  // namespace trident
