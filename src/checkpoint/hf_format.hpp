// Hugging Face's layouts of Trident's models (docs/DESIGN.md "Hugging Face formats"), used by
// checkpoint/hf_convert (apps/convert_checkpoint):
//   GPT  -> GPT2LMHeadModel ("gpt2"): Conv1D weights stored [in, out], so every linear weight is
//           transposed; q|k|v rows become c_attn's q|k|v columns; the LM head is tied to wte.
//   BERT -> MegatronBertForPreTraining ("megatron-bert"; MegatronBertForMaskedLM without
//           bert.binary_head): Trident's BERT is Megatron's, with a LayerNorm before attention and
//           before the MLP and one after the last layer, and no LayerNorm on the embeddings;
//           BertForPreTraining (LayerNorm after each residual add and on the embeddings) is
//           another network. Linear weights are [out, in] as in Trident; qkv splits into query,
//           key and value; the sentence-order head is the NSP head (label 0: the segments in order).
//   GPT with the Llama-family layer (rotary positions, RMSNorm, SwiGLU) -> LlamaForCausalLM
//           ("llama"), MistralForCausalLM ("mistral"), Qwen2ForCausalLM ("qwen2") or
//           Qwen3ForCausalLM ("qwen3"): weights [out, in]; qkv's rows [q heads; k groups;
//           v groups] are q_proj, k_proj and v_proj (Hugging Face's rows already in the
//           rotate-half order Trident's rotary positions use); fc1's [gate; up] rows are
//           gate_proj and up_proj; q/k norms are q_norm and k_norm; an untied output layer is
//           lm_head. Which biases a family has: Llama's attention_bias (q, k, v, o) and mlp_bias,
//           which Trident expresses together (add_bias_linear); Qwen 2's q/k/v biases alone
//           (add_qkv_bias); none for Mistral and Qwen 3 (Qwen 3's attention_bias would bias o
//           without the MLP, which Trident's keys cannot say: refused).
//   GPT with MoE layers ([moe]) -> MixtralForCausalLM ("mixtral": every layer MoE, the router
//           block_sparse_moe.gate, expert j's w1 | w3 = fc1's gate | up rows and w2 = fc2; softmax
//           over all experts, top-k, renormalised: Trident's default routing) or
//           Qwen3MoeForCausalLM ("qwen3_moe": Qwen 3's attention; the router mlp.gate, expert j's
//           gate_proj | up_proj and down_proj; norm_topk_prob false is moe.router_pre_softmax;
//           mlp_only_layers / decoder_sparse_step are moe.layer_freq's dense layers).
// Checkpoints keep the unpadded vocabulary, so nothing is cut or padded on the way.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/deck.hpp"

namespace trident {

enum class HfLayout {
  Same,        // the same values and shape
  Transposed,  // [rows, cols] <-> [cols, rows] (GPT-2's Conv1D)
  RowBlocks,   // [r1 + r2 + ..., ...] <-> tensors of [r1, ...], [r2, ...], ... (q|k|v, gate|up)
};

struct HfTensor {
  std::string trident;              // e.g. model/layers/0/self_attention/qkv/weight
  std::vector<std::int64_t> shape;  // its global shape in Trident's checkpoint
  std::vector<std::string> hf;      // one name, or one per row block
  HfLayout layout = HfLayout::Same;
  std::vector<std::int64_t> rows;  // RowBlocks: the rows of each block, in order
  // The shape of Hugging Face tensor i of this entry.
  std::vector<std::int64_t> hf_shape(size_t i) const;
  // RowBlocks: the first row of block i in the Trident tensor.
  std::int64_t row0(size_t i) const;
};

// The Hugging Face architectures converted, by config.json's model_type.
enum class HfFamily { Gpt2, MegatronBert, Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen3Moe };

const char* hf_model_type(HfFamily f);     // "gpt2", "megatron-bert", "llama", ...
const char* hf_trident_model(HfFamily f);  // "gpt" or "bert"
bool hf_is_llama_family(HfFamily f);

// The family of a config.json model_type; throws naming `where` for one not converted.
HfFamily hf_family_of(const std::string& model_type, const std::string& where);

// The family a Trident model of kind `model` ("gpt", "bert") and deck `d` exports as: `requested`
// ("" for the deck's own: gpt2 for GPT-2's layer; qwen3 with q/k norms, qwen2 with a qkv bias
// alone, else llama for the Llama-family layer; megatron-bert for BERT) or the model_type named,
// which the deck must be expressible as. Throws naming what the family cannot hold.
HfFamily hf_export_family(const std::string& model, const Deck& d, const std::string& requested);

// Every tensor of model family `f` of deck `d` (its [model] keys, bert.binary_head) with
// `vocab` tokens, and its Hugging Face names, in Hugging Face's order (the order
// save_pretrained writes and shards them). GPT-2's names carry GPT2LMHeadModel's
// "transformer." prefix.
std::vector<HfTensor> hf_tensor_map(HfFamily f, const Deck& d, std::int64_t vocab);

struct HfModelFacts {
  std::string model;  // "gpt" or "bert"
  HfFamily family = HfFamily::Gpt2;
  std::int64_t vocab_size = 0;  // rows of the word embeddings
  std::int64_t eod = -1;        // GPT: end-of-document id (eos of the config), -1 unknown
  bool binary_head = true;      // BERT: the NSP head is present (set by the caller from the tensors)
  std::string torch_dtype;      // as the config says ("" when absent)
};

// config.json of family `f` for a Trident model described by `deck` (its model keys) with
// `vocab` tokens, weights stored as `dtype` ("float32", "bfloat16", "float16"); `eod` (>= 0) is
// bos and eos of GPT-2, eos of the Llama family.
std::string hf_config_json(HfFamily f, const Deck& deck, std::int64_t vocab, std::int64_t eod,
                           const std::string& dtype);

// The Trident deck (INI text: model keys, and BERT's bert.binary_head from facts.binary_head) of
// a Hugging Face config.json; `seq_length` 0 means the position table's length. Options that
// Trident's models do not have (another activation, rotary scaling other than llama3, an active
// sliding window, a bias combination the family cannot express, GPT-2 with untied embeddings,
// attention scaled per layer, relative positions, another architecture) are refused with an
// error naming the key; `where` names the file.
std::string deck_from_hf_config(const std::string& config_json, const std::string& where, std::int64_t seq_length,
                                HfModelFacts& facts);

}  // namespace trident
