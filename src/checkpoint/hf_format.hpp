// Hugging Face's layout of Trident's models (docs/DESIGN.md "Hugging Face format"), used by
// apps/convert_checkpoint.cpp:
//   GPT  -> GPT2LMHeadModel ("gpt2"): Conv1D weights stored [in, out], so every linear weight is
//           transposed; q|k|v rows become c_attn's q|k|v columns; the LM head is tied to wte.
//   BERT -> MegatronBertForPreTraining ("megatron-bert"; MegatronBertForMaskedLM without
//           bert.binary_head): Trident's BERT is Megatron's, with a
//           LayerNorm before attention and before the MLP and one after the last layer, and no
//           LayerNorm on the embeddings; BertForPreTraining (LayerNorm after each residual add
//           and on the embeddings) is another network. Linear weights are [out, in] as in
//           Trident; qkv splits into query, key and value; the sentence-order head is the NSP
//           head (label 0: the segments in order).
// Checkpoints keep the unpadded vocabulary, so nothing is cut or padded on the way.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/deck.hpp"
#include "io/safetensors.hpp"

namespace trident {

enum class HfLayout {
  Same,        // the same values and shape
  Transposed,  // [rows, cols] <-> [cols, rows] (GPT-2's Conv1D)
  RowThirds,   // [3n, ...] <-> three tensors of [n, ...] (query, key, value)
};

struct HfTensor {
  std::string trident;          // e.g. model/layers/0/self_attention/qkv/weight
  std::vector<std::string> hf;  // one name, or three (RowThirds)
  HfLayout layout = HfLayout::Same;
};

// Every tensor of a Trident model of kind `model` ("gpt" or "bert") and its Hugging Face names
// (GPT: with the "transformer." prefix that GPT2LMHeadModel writes). Throws for other kinds.
std::vector<HfTensor> hf_tensor_map(const std::string& model, std::int64_t num_layers, bool binary_head);

// A Trident global tensor (row-major, `shape`) as its Hugging Face tensors.
std::vector<SafeTensorOut> to_hf(const HfTensor& m, const std::vector<std::int64_t>& shape,
                                 const std::vector<float>& values);

// The Trident global tensor of shape `shape` from Hugging Face tensors; `get(name, hf_shape)`
// returns the named tensor's values after checking its shape (it throws naming the file).
std::vector<float> from_hf(
    const HfTensor& m, const std::vector<std::int64_t>& shape,
    const std::function<std::vector<float>(const std::string&, const std::vector<std::int64_t>&)>& get);

struct HfModelFacts {
  std::string model;            // "gpt" or "bert"
  std::int64_t vocab_size = 0;  // rows of the word embeddings
  std::int64_t eod = -1;        // GPT: end-of-document id (bos/eos of the config), -1 unknown
  bool binary_head = true;      // BERT: the NSP head is present (set by the caller from the tensors)
  std::string torch_dtype;      // as the config says ("" when absent)
};

// config.json for a Trident model described by `deck` (its model keys) with `vocab` tokens,
// weights stored as `dtype` ("float32", "bfloat16", "float16"). GPT: `eod` is bos and eos.
std::string hf_config_json(const std::string& model, const Deck& deck, std::int64_t vocab, std::int64_t eod,
                           const std::string& dtype);

// The Trident deck (INI text: model keys, and BERT's bert.binary_head from facts.binary_head) of
// a Hugging Face config.json;
// `seq_length` 0 means the position table's length. Options that Trident's models do not have
// (another activation, untied embeddings, attention scaled per layer, relative positions,
// another architecture) are refused with an error naming the key; `where` names the file.
std::string deck_from_hf_config(const std::string& config_json, const std::string& where, std::int64_t seq_length,
                                HfModelFacts& facts);

}  // namespace trident
