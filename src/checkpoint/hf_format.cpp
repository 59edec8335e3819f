#include "checkpoint/hf_format.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"

namespace trident {

namespace {

std::string str(std::int64_t i) { return std::to_string(i); }

struct FamilyInfo {
  HfFamily family;
  const char* model_type;
  const char* architecture;
  const char* trident_model;
};
constexpr FamilyInfo kFamilies[] = {
    {HfFamily::Gpt2, "gpt2", "GPT2LMHeadModel", "gpt"},
    {HfFamily::MegatronBert, "megatron-bert", "MegatronBertForPreTraining", "bert"},
    {HfFamily::Llama, "llama", "LlamaForCausalLM", "gpt"},
    {HfFamily::Mistral, "mistral", "MistralForCausalLM", "gpt"},
    {HfFamily::Qwen2, "qwen2", "Qwen2ForCausalLM", "gpt"},
    {HfFamily::Qwen3, "qwen3", "Qwen3ForCausalLM", "gpt"},
    {HfFamily::Mixtral, "mixtral", "MixtralForCausalLM", "gpt"},
    {HfFamily::Qwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM", "gpt"},
};
bool is_moe_family(HfFamily f) { return f == HfFamily::Mixtral || f == HfFamily::Qwen3Moe; }
const FamilyInfo& info(HfFamily f) {
  for (const auto& i : kFamilies)
    if (i.family == f) return i;
  throw Error::all("internal: unknown Hugging Face family");
}
std::string family_names() {
  std::string s;
  for (const auto& i : kFamilies) s += (s.empty() ? "" : ", ") + std::string(i.model_type);
  return s;
}

// What of a GPT deck's layer a Llama-family export cannot hold ("" when it can): the layer must
// be the Llama family's (rotary positions over whole heads, RMSNorm, SwiGLU).
std::string llama_layer_gap(const Deck& d) {
  const auto& m = d.model;
  if (m.position_embedding_type != "rope") return "model.position_embedding_type = " + m.position_embedding_type;
  if (m.rotary_percent != 1.0) return "model.rotary_percent = " + std::to_string(m.rotary_percent);
  if (m.normalization != "RMSNorm") return "model.normalization = " + m.normalization;
  if (!m.swiglu) return "model.swiglu = false (a GELU MLP)";
  return "";
}

}  // namespace

std::vector<std::int64_t> HfTensor::hf_shape(size_t i) const {
  if (layout == HfLayout::Same) return shape;
  if (layout == HfLayout::Transposed) return {shape[1], shape[0]};
  std::vector<std::int64_t> s = shape;
  s[0] = rows.at(i);
  return s;
}

std::int64_t HfTensor::row0(size_t i) const {
  std::int64_t r = 0;
  for (size_t b = 0; b < i; ++b) r += rows.at(b);
  return r;
}

const char* hf_model_type(HfFamily f) { return info(f).model_type; }
const char* hf_trident_model(HfFamily f) { return info(f).trident_model; }
bool hf_is_llama_family(HfFamily f) {
  return f == HfFamily::Llama || f == HfFamily::Mistral || f == HfFamily::Qwen2 || f == HfFamily::Qwen3 ||
         is_moe_family(f);
}

HfFamily hf_family_of(const std::string& model_type, const std::string& where) {
  for (const auto& i : kFamilies)
    if (model_type == i.model_type) return i.family;
  if (model_type == "bert")
    throw Error::all(where +
                     ": model_type 'bert' (BertForPreTraining) normalizes after each residual add and on the "
                     "embeddings; Trident's BERT is Megatron's (pre-LayerNorm): convert megatron-bert "
                     "(MegatronBertForPreTraining) checkpoints");
  throw Error::all(where + ": model_type '" + model_type + "' is not converted (" + family_names() + " are)");
}

HfFamily hf_export_family(const std::string& model, const Deck& d, const std::string& requested) {
  const auto& m = d.model;
  if (model == "bert") {
    TRIDENT_REQUIRE(requested.empty() || requested == "megatron-bert",
                    "a BERT checkpoint exports as megatron-bert, not " << requested);
    return HfFamily::MegatronBert;
  }
  TRIDENT_REQUIRE(model == "gpt", "a " << model << " checkpoint has no Hugging Face counterpart here (GPT and BERT "
                                       << "are converted)");
  const bool llama_layer = m.position_embedding_type == "rope" || m.normalization == "RMSNorm" || m.swiglu;
  HfFamily f;
  if (!requested.empty()) {
    f = hf_family_of(requested, "--hf-architecture");
    TRIDENT_REQUIRE(f != HfFamily::MegatronBert, "a GPT checkpoint does not export as megatron-bert");
  } else if (!llama_layer) {
    f = HfFamily::Gpt2;
  } else if (m.moe.on()) {
    f = m.qk_layernorm ? HfFamily::Qwen3Moe : HfFamily::Mixtral;
  } else if (m.qk_layernorm) {
    f = HfFamily::Qwen3;
  } else if (m.add_qkv_bias && !m.add_bias_linear) {
    f = HfFamily::Qwen2;
  } else {
    f = HfFamily::Llama;
  }
  const std::string name = hf_model_type(f);
  auto refuse = [&](const std::string& what) {
    throw Error::all("this checkpoint cannot be written as " + name + ": " + what);
  };
  if (f == HfFamily::Gpt2) {
    if (llama_layer) refuse("its layer is the Llama family's (rotary positions, RMSNorm or SwiGLU)");
    if (m.untie_embeddings_and_output_weights) refuse("GPT2LMHeadModel's output layer is tied to the embeddings");
    if (!m.add_bias_linear || m.groups() != m.num_heads || m.head_dim() * m.num_heads != m.hidden_size ||
        m.qk_layernorm)
      refuse("GPT-2's layer has biases and multi-head attention of hidden / heads channels, nothing else");
    return f;
  }
  if (const std::string gap = llama_layer_gap(d); !gap.empty()) refuse(gap);
  const bool qkv_only = m.add_qkv_bias && !m.add_bias_linear;
  if (m.moe.on() && !is_moe_family(f))
    refuse("it has MoE layers (moe.num_experts = " + str(m.moe.num_experts) + "): mixtral and qwen3_moe hold them");
  if (is_moe_family(f)) {
    if (!m.moe.on()) refuse("it has no MoE layers (moe.num_experts = 0)");
    if (m.moe.router_score_function != "softmax")
      refuse("moe.router_score_function = sigmoid (" + name + " routes by softmax)");
    if (m.moe.shared_expert_intermediate_size > 0) refuse("a shared expert (" + name + " has none)");
    if (m.moe.router_enable_expert_bias) refuse("an expert bias (" + name + " has none)");
    if (m.qkv_bias()) refuse("linear biases (" + name + " has none)");
  }
  switch (f) {
    case HfFamily::Llama:
      if (m.qk_layernorm) refuse("model.qk_layernorm (Llama has no q/k norms: qwen3 has)");
      if (qkv_only) refuse("a qkv bias without the other biases (qwen2 has that)");
      break;
    case HfFamily::Mistral:
      if (m.qk_layernorm) refuse("model.qk_layernorm (Mistral has no q/k norms)");
      if (m.qkv_bias()) refuse("linear biases (Mistral has none)");
      break;
    case HfFamily::Qwen2:
      if (m.qk_layernorm) refuse("model.qk_layernorm (Qwen 2 has no q/k norms: qwen3 has)");
      if (!qkv_only)
        refuse("Qwen 2 has q/k/v biases and no other (model.add_qkv_bias = true, add_bias_linear = false)");
      if (m.head_dim() * m.num_heads != m.hidden_size)
        refuse("model.kv_channels = " + str(m.head_dim()) + ": Qwen 2's heads are hidden / heads wide");
      break;
    case HfFamily::Qwen3:
      if (!m.qk_layernorm) refuse("Qwen 3 has q/k norms (model.qk_layernorm = true)");
      if (m.qkv_bias())
        refuse(
            "linear biases (Qwen 3's attention_bias biases q, k, v and o without the MLP, which "
            "model.add_bias_linear and add_qkv_bias cannot express)");
      break;
    case HfFamily::Mixtral:
      if (m.qk_layernorm) refuse("model.qk_layernorm (Mixtral has no q/k norms: qwen3_moe has)");
      if (m.moe.router_pre_softmax) refuse("moe.router_pre_softmax (Mixtral renormalises the top-k weights)");
      for (std::int64_t i = 0; i < m.num_layers; ++i)
        if (!m.moe.layer(i)) refuse("layer " + str(i) + " is dense (every Mixtral layer is MoE)");
      break;
    case HfFamily::Qwen3Moe:
      if (!m.qk_layernorm) refuse("Qwen 3 MoE has q/k norms (model.qk_layernorm = true)");
      break;
    default: break;
  }
  return f;
}

std::vector<HfTensor> hf_tensor_map(HfFamily f, const Deck& d, std::int64_t vocab) {
  const auto& md = d.model;
  const std::int64_t C = md.hidden_size, L = md.num_layers, P = md.max_position_embeddings;
  const std::int64_t F = md.ffn_hidden_size > 0 ? md.ffn_hidden_size : 4 * C;
  std::vector<HfTensor> m;
  auto add = [&](const std::string& t, std::vector<std::int64_t> shape, const std::string& h,
                 HfLayout l = HfLayout::Same) {
    m.push_back({t, std::move(shape), {h}, l, {}});
  };
  auto wb = [&](const std::string& t, std::vector<std::int64_t> shape, const std::string& h,
                HfLayout weight_layout = HfLayout::Same) {
    add(t + "/weight", shape, h + ".weight", weight_layout);
    add(t + "/bias", {shape[0]}, h + ".bias");
  };
  if (f == HfFamily::Gpt2) {
    const std::string p = "transformer.";
    add("model/embedding/word_embeddings", {vocab, C}, p + "wte.weight");
    add("model/embedding/position_embeddings", {P, C}, p + "wpe.weight");
    for (std::int64_t i = 0; i < L; ++i) {
      const std::string t = "model/layers/" + str(i) + "/", h = p + "h." + str(i) + ".";
      wb(t + "input_layernorm", {C}, h + "ln_1");
      wb(t + "self_attention/qkv", {3 * C, C}, h + "attn.c_attn", HfLayout::Transposed);
      wb(t + "self_attention/proj", {C, C}, h + "attn.c_proj", HfLayout::Transposed);
      wb(t + "post_attention_layernorm", {C}, h + "ln_2");
      wb(t + "mlp/fc1", {F, C}, h + "mlp.c_fc", HfLayout::Transposed);
      wb(t + "mlp/fc2", {C, F}, h + "mlp.c_proj", HfLayout::Transposed);
    }
    wb("model/final_layernorm", {C}, p + "ln_f");
    return m;
  }
  if (f == HfFamily::MegatronBert) {
    add("model/embedding/word_embeddings", {vocab, C}, "bert.embeddings.word_embeddings.weight");
    add("model/embedding/position_embeddings", {P, C}, "bert.embeddings.position_embeddings.weight");
    add("model/embedding/tokentype_embeddings", {2, C}, "bert.embeddings.token_type_embeddings.weight");
    for (std::int64_t i = 0; i < L; ++i) {
      const std::string t = "model/layers/" + str(i) + "/", h = "bert.encoder.layer." + str(i) + ".";
      wb(t + "input_layernorm", {C}, h + "attention.ln");
      for (const char* part : {"weight", "bias"})
        m.push_back(
            {t + "self_attention/qkv/" + part,
             std::string(part) == "weight" ? std::vector<std::int64_t>{3 * C, C} : std::vector<std::int64_t>{3 * C},
             {h + "attention.self.query." + part, h + "attention.self.key." + part, h + "attention.self.value." + part},
             HfLayout::RowBlocks,
             {C, C, C}});
      wb(t + "self_attention/proj", {C, C}, h + "attention.output.dense");
      wb(t + "post_attention_layernorm", {C}, h + "ln");
      wb(t + "mlp/fc1", {F, C}, h + "intermediate.dense");
      wb(t + "mlp/fc2", {C, F}, h + "output.dense");
    }
    wb("model/final_layernorm", {C}, "bert.encoder.ln");
    wb("model/lm_head/dense", {C, C}, "cls.predictions.transform.dense");
    wb("model/lm_head/layernorm", {C}, "cls.predictions.transform.LayerNorm");
    add("model/lm_head/bias", {vocab}, "cls.predictions.bias");
    if (d.bert.binary_head) {
      wb("model/pooler/dense", {C, C}, "bert.pooler.dense");
      wb("model/binary_head", {2, C}, "cls.seq_relationship");
    }
    return m;
  }
  // the Llama family (Hugging Face's module order: attention, MLP, then the layer's two norms)
  const std::int64_t q = md.q_width(), kv = md.kv_width(), hd = md.head_dim();
  add("model/embedding/word_embeddings", {vocab, C}, "model.embed_tokens.weight");
  for (std::int64_t i = 0; i < L; ++i) {
    const std::string t = "model/layers/" + str(i) + "/", h = "model.layers." + str(i) + ".";
    const std::string a = h + "self_attn.";
    m.push_back({t + "self_attention/qkv/weight",
                 {q + 2 * kv, C},
                 {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                 HfLayout::RowBlocks,
                 {q, kv, kv}});
    if (md.qkv_bias())
      m.push_back({t + "self_attention/qkv/bias",
                   {q + 2 * kv},
                   {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
                   HfLayout::RowBlocks,
                   {q, kv, kv}});
    add(t + "self_attention/proj/weight", {C, q}, a + "o_proj.weight");
    if (md.add_bias_linear) add(t + "self_attention/proj/bias", {C}, a + "o_proj.bias");
    if (md.qk_layernorm) {
      add(t + "self_attention/q_layernorm/weight", {hd}, a + "q_norm.weight");
      add(t + "self_attention/k_layernorm/weight", {hd}, a + "k_norm.weight");
    }
    if (is_moe_family(f) && md.moe.layer(i)) {  // the router and the experts
      const std::int64_t E = md.moe.num_experts, Fe = md.moe.ffn_hidden_size;
      const bool mixtral = f == HfFamily::Mixtral;
      const std::string b = h + (mixtral ? "block_sparse_moe." : "mlp.");
      add(t + "mlp/router/weight", {E, C}, b + "gate.weight");
      for (std::int64_t j = 0; j < E; ++j) {
        const std::string te = t + "mlp/experts/" + str(j) + "/", he = b + "experts." + str(j) + ".";
        m.push_back(
            {te + "fc1/weight",
             {2 * Fe, C},
             {he + (mixtral ? "w1.weight" : "gate_proj.weight"), he + (mixtral ? "w3.weight" : "up_proj.weight")},
             HfLayout::RowBlocks,
             {Fe, Fe}});
        add(te + "fc2/weight", {C, Fe}, he + (mixtral ? "w2.weight" : "down_proj.weight"));
      }
      add(t + "input_layernorm/weight", {C}, h + "input_layernorm.weight");
      add(t + "post_attention_layernorm/weight", {C}, h + "post_attention_layernorm.weight");
      continue;
    }
    m.push_back({t + "mlp/fc1/weight",
                 {2 * F, C},
                 {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"},
                 HfLayout::RowBlocks,
                 {F, F}});
    if (md.add_bias_linear)
      m.push_back({t + "mlp/fc1/bias",
                   {2 * F},
                   {h + "mlp.gate_proj.bias", h + "mlp.up_proj.bias"},
                   HfLayout::RowBlocks,
                   {F, F}});
    add(t + "mlp/fc2/weight", {C, F}, h + "mlp.down_proj.weight");
    if (md.add_bias_linear) add(t + "mlp/fc2/bias", {C}, h + "mlp.down_proj.bias");
    add(t + "input_layernorm/weight", {C}, h + "input_layernorm.weight");
    add(t + "post_attention_layernorm/weight", {C}, h + "post_attention_layernorm.weight");
  }
  add("model/final_layernorm/weight", {C}, "model.norm.weight");
  if (md.untie_embeddings_and_output_weights) add("model/output_layer/weight", {vocab, C}, "lm_head.weight");
  return m;
}

std::string hf_config_json(HfFamily f, const Deck& d, std::int64_t vocab, std::int64_t eod, const std::string& dtype) {
  const auto& md = d.model;
  nlohmann::ordered_json c;
  if (f == HfFamily::Gpt2) {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["vocab_size"] = vocab;
    c["n_positions"] = md.max_position_embeddings;
    c["n_embd"] = md.hidden_size;
    c["n_layer"] = md.num_layers;
    c["n_head"] = md.num_heads;
    c["n_inner"] = md.ffn_hidden_size;
    c["activation_function"] = "gelu_new";  // the tanh approximation Trident computes
    c["layer_norm_epsilon"] = md.norm_epsilon;
    c["initializer_range"] = md.init_method_std;
    c["resid_pdrop"] = md.hidden_dropout;
    c["embd_pdrop"] = md.hidden_dropout;
    c["attn_pdrop"] = md.attention_dropout;
    if (eod >= 0) {
      c["bos_token_id"] = eod;
      c["eos_token_id"] = eod;
    }
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
    c["reorder_and_upcast_attn"] = false;
    c["tie_word_embeddings"] = true;
    c["use_cache"] = true;
  } else if (f == HfFamily::MegatronBert) {
    // without the sentence-order head there is no NSP head to fill: the masked-LM class
    c["architectures"] = {d.bert.binary_head ? "MegatronBertForPreTraining" : "MegatronBertForMaskedLM"};
    c["model_type"] = "megatron-bert";
    c["vocab_size"] = vocab;
    c["hidden_size"] = md.hidden_size;
    c["num_hidden_layers"] = md.num_layers;
    c["num_attention_heads"] = md.num_heads;
    c["intermediate_size"] = md.ffn_hidden_size;
    c["hidden_act"] = "gelu_new";
    c["hidden_dropout_prob"] = md.hidden_dropout;
    c["attention_probs_dropout_prob"] = md.attention_dropout;
    c["max_position_embeddings"] = md.max_position_embeddings;
    c["type_vocab_size"] = 2;
    c["initializer_range"] = md.init_method_std;
    c["layer_norm_eps"] = md.norm_epsilon;
    c["position_embedding_type"] = "absolute";
    c["tie_word_embeddings"] = true;
  } else {
    c["architectures"] = {info(f).architecture};
    c["model_type"] = info(f).model_type;
    c["vocab_size"] = vocab;
    c["hidden_size"] = md.hidden_size;
    c["intermediate_size"] = md.ffn_hidden_size;
    c["num_hidden_layers"] = md.num_layers;
    c["num_attention_heads"] = md.num_heads;
    c["num_key_value_heads"] = md.groups();
    if (f != HfFamily::Qwen2) c["head_dim"] = md.head_dim();
    c["hidden_act"] = "silu";
    c["max_position_embeddings"] = md.max_position_embeddings;
    c["rms_norm_eps"] = md.norm_epsilon;
    c["rope_theta"] = md.rotary_base;
    if (md.use_rope_scaling)
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", md.rope_scaling_factor},
                           {"low_freq_factor", md.rope_low_freq_factor},
                           {"high_freq_factor", md.rope_high_freq_factor},
                           {"original_max_position_embeddings", md.rope_original_max_position_embeddings}};
    else
      c["rope_scaling"] = nullptr;
    c["attention_dropout"] = md.attention_dropout;
    c["initializer_range"] = md.init_method_std;
    if (f == HfFamily::Llama) {
      c["attention_bias"] = md.add_bias_linear;
      c["mlp_bias"] = md.add_bias_linear;
    } else if (f == HfFamily::Qwen3) {
      c["attention_bias"] = false;
    }
    if (f == HfFamily::Mistral || f == HfFamily::Mixtral) c["sliding_window"] = nullptr;
    if (f == HfFamily::Mixtral) {
      c["intermediate_size"] = md.moe.ffn_hidden_size;
      c["num_local_experts"] = md.moe.num_experts;
      c["num_experts_per_tok"] = md.moe.router_topk;
      c["router_aux_loss_coef"] = md.moe.aux_loss_coeff;
      c["router_jitter_noise"] = 0.0;
      c["output_router_logits"] = false;
    }
    if (f == HfFamily::Qwen3Moe) {
      c["attention_bias"] = false;
      c["num_experts"] = md.moe.num_experts;
      c["num_experts_per_tok"] = md.moe.router_topk;
      c["moe_intermediate_size"] = md.moe.ffn_hidden_size;
      c["norm_topk_prob"] = !md.moe.router_pre_softmax;
      c["decoder_sparse_step"] = 1;
      std::vector<std::int64_t> dense;
      for (std::int64_t i = 0; i < md.num_layers; ++i)
        if (!md.moe.layer(i)) dense.push_back(i);
      c["mlp_only_layers"] = dense;
      c["router_aux_loss_coef"] = md.moe.aux_loss_coeff;
      c["output_router_logits"] = false;
    }
    if (f == HfFamily::Qwen2 || f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe) {
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
      c["max_window_layers"] = md.num_layers;
    }
    if (eod >= 0) c["eos_token_id"] = eod;
    c["tie_word_embeddings"] = !md.untie_embeddings_and_output_weights;
    c["use_cache"] = true;
  }
  c["torch_dtype"] = dtype;
  return c.dump(2) + "\n";
}

std::string deck_from_hf_config(const std::string& text, const std::string& where, std::int64_t seq_length,
                                HfModelFacts& facts) {
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error::all(where + ": not JSON (" + e.what() + ")");
  }
  TRIDENT_REQUIRE(c.is_object(), where << ": not a JSON object");
  auto has = [&](const char* k) { return c.contains(k) && !c[k].is_null(); };
  auto integer = [&](const char* k) -> std::int64_t {
    TRIDENT_REQUIRE(has(k), where << ": '" << k << "' is missing");
    TRIDENT_REQUIRE(c[k].is_number_integer() && c[k].get<std::int64_t>() > 0,
                    where << ": '" << k << "' must be a positive integer, not " << c[k].dump());
    return c[k].get<std::int64_t>();
  };
  auto number = [&](const char* k, double def) -> double {
    if (!has(k)) return def;
    TRIDENT_REQUIRE(c[k].is_number(), where << ": '" << k << "' must be a number, not " << c[k].dump());
    return c[k].get<double>();
  };
  auto flag = [&](const char* k, bool def) -> bool {
    if (!has(k)) return def;
    TRIDENT_REQUIRE(c[k].is_boolean(), where << ": '" << k << "' must be true or false, not " << c[k].dump());
    return c[k].get<bool>();
  };
  auto text_of = [&](const char* k, const std::string& def) -> std::string {
    if (!has(k)) return def;
    TRIDENT_REQUIRE(c[k].is_string(), where << ": '" << k << "' must be a string, not " << c[k].dump());
    return c[k].get<std::string>();
  };
  // eos_token_id: one id, or a list (Llama 3 Instruct) whose first entry ends a document
  auto eos = [&]() -> std::int64_t {
    if (!has("eos_token_id")) return -1;
    const auto& e = c["eos_token_id"];
    const auto& first = e.is_array() && !e.empty() ? e[0] : e;
    TRIDENT_REQUIRE(first.is_number_integer(), where << ": 'eos_token_id' must be an integer or a list of them");
    return first.get<std::int64_t>();
  };
  const std::string type = text_of("model_type", "");
  TRIDENT_REQUIRE(!type.empty(), where << ": 'model_type' is missing (" << family_names() << " are converted)");
  facts.family = hf_family_of(type, where);
  facts.model = hf_trident_model(facts.family);
  auto activation = [&](const char* k, const std::string& def) {
    const std::string a = text_of(k, def);
    TRIDENT_REQUIRE(a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast",
                    where << ": '" << k << "' is '" << a
                          << "': Trident's GPT-2 and BERT compute GELU's tanh approximation only (gelu_new)");
  };
  std::int64_t layers = 0, hidden = 0, heads = 0, ffn = 0, positions = 0;
  // the shape keys that Megatron-BERT and the Llama family name alike
  auto shape_keys = [&] {
    layers = integer("num_hidden_layers");
    hidden = integer("hidden_size");
    heads = integer("num_attention_heads");
    ffn = integer("intermediate_size");
    positions = integer("max_position_embeddings");
    facts.vocab_size = integer("vocab_size");
  };
  double eps = 1e-5, std_init = 0.02, hd = 0.1, ad = 0.1;
  std::ostringstream extra;  // the Llama family's further keys
  extra << std::setprecision(17);
  std::ostringstream moe_ini;  // MoE families: the [moe] section
  moe_ini << std::setprecision(17);
  if (facts.family == HfFamily::Gpt2) {
    TRIDENT_REQUIRE(flag("tie_word_embeddings", true),
                    where << ": 'tie_word_embeddings' is false: GPT-2's output layer is the word embeddings (tied)");
    layers = integer("n_layer");
    hidden = integer("n_embd");
    heads = integer("n_head");
    ffn = has("n_inner") ? integer("n_inner") : 4 * hidden;
    positions = integer("n_positions");
    facts.vocab_size = integer("vocab_size");
    activation("activation_function", "gelu_new");
    eps = number("layer_norm_epsilon", 1e-5);
    std_init = number("initializer_range", 0.02);
    hd = number("resid_pdrop", 0.1);
    TRIDENT_REQUIRE(number("embd_pdrop", hd) == hd,
                    where << ": 'embd_pdrop' differs from 'resid_pdrop': Trident has one model.hidden_dropout");
    ad = number("attn_pdrop", 0.1);
    TRIDENT_REQUIRE(flag("scale_attn_weights", true),
                    where << ": 'scale_attn_weights' is false: Trident scales attention scores by 1/sqrt(head size)");
    TRIDENT_REQUIRE(!flag("scale_attn_by_inverse_layer_idx", false),
                    where << ": 'scale_attn_by_inverse_layer_idx' is true: Trident does not scale attention per layer");
    TRIDENT_REQUIRE(!flag("add_cross_attention", false),
                    where << ": 'add_cross_attention' is true: Trident's GPT has no cross-attention");
    facts.eod = eos();
  } else if (facts.family == HfFamily::MegatronBert) {
    TRIDENT_REQUIRE(flag("tie_word_embeddings", true),
                    where << ": 'tie_word_embeddings' is false: BERT's output layer is the word embeddings (tied)");
    shape_keys();
    activation("hidden_act", "gelu");
    eps = number("layer_norm_eps", 1e-12);
    std_init = number("initializer_range", 0.02);
    hd = number("hidden_dropout_prob", 0.1);
    ad = number("attention_probs_dropout_prob", 0.1);
    TRIDENT_REQUIRE(integer("type_vocab_size") == 2, where << ": 'type_vocab_size' is " << c["type_vocab_size"].dump()
                                                           << ": Trident's BERT has 2 token types");
    const std::string pos = text_of("position_embedding_type", "absolute");
    TRIDENT_REQUIRE(pos == "absolute", where << ": 'position_embedding_type' is '" << pos
                                             << "': Trident's BERT learns absolute position embeddings");
  } else {  // Llama, Mistral, Qwen 2, Qwen 3
    const HfFamily f = facts.family;
    shape_keys();
    const std::int64_t groups = has("num_key_value_heads") ? integer("num_key_value_heads") : heads;
    TRIDENT_REQUIRE(heads % groups == 0, where << ": " << heads << " attention heads are not a multiple of " << groups
                                               << " key/value heads");
    const std::string act = text_of("hidden_act", "silu");
    TRIDENT_REQUIRE(act == "silu",
                    where << ": 'hidden_act' is '" << act << "': Trident's Llama-family MLP is SwiGLU (silu)");
    eps = number("rms_norm_eps", 1e-6);
    std_init = number("initializer_range", 0.02);
    hd = 0.0;
    ad = number("attention_dropout", 0.0);
    TRIDENT_REQUIRE(!has("partial_rotary_factor") || number("partial_rotary_factor", 1.0) == 1.0,
                    where << ": 'partial_rotary_factor' is " << c["partial_rotary_factor"].dump()
                          << ": the converter turns whole heads");
    // sliding-window attention: Mistral's sliding_window (on when set), Qwen's use_sliding_window
    if ((f == HfFamily::Mistral || f == HfFamily::Mixtral) && has("sliding_window"))
      TRIDENT_REQUIRE(integer("sliding_window") >= positions,
                      where << ": 'sliding_window' is " << c["sliding_window"].dump()
                            << ": sliding-window attention (Mistral 7B v0.1) is not implemented");
    if (f == HfFamily::Qwen2 || f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe)
      TRIDENT_REQUIRE(!flag("use_sliding_window", false),
                      where << ": 'use_sliding_window' is true: sliding-window attention is not implemented");
    // the biases each family has
    bool bias_linear = false, qkv_bias = false;
    if (f == HfFamily::Llama) {
      const bool attn = flag("attention_bias", false), mlp = flag("mlp_bias", false);
      TRIDENT_REQUIRE(attn == mlp, where << ": 'attention_bias' is " << (attn ? "true" : "false") << " and 'mlp_bias' "
                                         << (mlp ? "true" : "false")
                                         << ": Trident biases every linear or none (model.add_bias_linear)");
      bias_linear = attn;
    } else if (f == HfFamily::Qwen2) {
      qkv_bias = true;  // Qwen 2 always biases q, k and v (and nothing else)
    } else if (f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe) {
      TRIDENT_REQUIRE(!flag("attention_bias", false),
                      where << ": 'attention_bias' is true: biases on q, k, v and o without the MLP cannot be "
                               "expressed by model.add_bias_linear and add_qkv_bias");
    }
    // rotary positions and Llama 3.1's frequency scaling
    if (has("rope_scaling")) {
      const auto& r = c["rope_scaling"];
      TRIDENT_REQUIRE(r.is_object(), where << ": 'rope_scaling' must be an object or null");
      std::string kind = r.contains("rope_type") && r["rope_type"].is_string() ? r["rope_type"].get<std::string>() : "";
      if (kind.empty() && r.contains("type") && r["type"].is_string()) kind = r["type"].get<std::string>();
      TRIDENT_REQUIRE(kind == "llama3" || kind == "default",
                      where << ": 'rope_scaling' of type '" << kind
                            << "' is not implemented (llama3 is; linear, dynamic, yarn and others are not)");
      if (kind == "llama3") {
        auto field = [&](const char* k) -> double {
          TRIDENT_REQUIRE(r.contains(k) && r[k].is_number(), where << ": rope_scaling needs a number '" << k << "'");
          return r[k].get<double>();
        };
        extra << "use_rope_scaling = true\nrope_scaling_factor = " << field("factor")
              << "\nrope_low_freq_factor = " << field("low_freq_factor")
              << "\nrope_high_freq_factor = " << field("high_freq_factor")
              << "\nrope_original_max_position_embeddings = "
              << static_cast<std::int64_t>(field("original_max_position_embeddings")) << "\n";
      }
    }
    const bool tie = flag("tie_word_embeddings", false);
    extra << "normalization = RMSNorm\nposition_embedding_type = rope\nrotary_base = " << number("rope_theta", 10000.0)
          << "\nswiglu = true\nnum_query_groups = " << groups
          << "\nadd_bias_linear = " << (bias_linear ? "true" : "false")
          << "\nadd_qkv_bias = " << (qkv_bias ? "true" : "false")
          << "\nuntie_embeddings_and_output_weights = " << (tie ? "false" : "true") << "\n";
    if (has("head_dim")) {
      extra << "kv_channels = " << integer("head_dim") << "\n";
    } else {
      TRIDENT_REQUIRE(hidden % heads == 0,
                      where << ": the hidden size " << hidden << " is not divisible by the " << heads << " heads");
    }
    if (f == HfFamily::Qwen3 || f == HfFamily::Qwen3Moe) extra << "qk_layernorm = true\n";
    facts.eod = eos();
    if (is_moe_family(f)) {  // the [moe] section
      const bool mixtral = f == HfFamily::Mixtral;
      const std::int64_t E = integer(mixtral ? "num_local_experts" : "num_experts");
      const std::int64_t k = integer("num_experts_per_tok");
      TRIDENT_REQUIRE(k <= E, where << ": 'num_experts_per_tok' " << k << " exceeds the " << E << " experts");
      const std::int64_t Fe = mixtral ? ffn : integer("moe_intermediate_size");
      std::string freq = "1";
      if (!mixtral) {  // Hugging Face's Qwen3MoeDecoderLayer: MoE unless listed in mlp_only_layers
                       // or off the decoder_sparse_step
        const std::int64_t step = has("decoder_sparse_step") ? integer("decoder_sparse_step") : 1;
        std::vector<std::int64_t> dense;
        if (has("mlp_only_layers")) {
          TRIDENT_REQUIRE(c["mlp_only_layers"].is_array(), where << ": 'mlp_only_layers' must be a list of layers");
          for (const auto& x : c["mlp_only_layers"]) {
            TRIDENT_REQUIRE(x.is_number_integer(), where << ": 'mlp_only_layers' must hold layer numbers");
            dense.push_back(x.get<std::int64_t>());
          }
        }
        freq = "[";
        for (std::int64_t i = 0; i < layers; ++i) {
          const bool moe = std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
          freq += (i ? "," : "") + std::string(moe ? "1" : "0");
        }
        freq += "]";
      }
      moe_ini << "[moe]\nnum_experts = " << E << "\nrouter_topk = " << k << "\nffn_hidden_size = " << Fe
              << "\nlayer_freq = " << freq
              << "\nrouter_pre_softmax = " << (!mixtral && !flag("norm_topk_prob", false) ? "true" : "false")
              << "\naux_loss_coeff = " << number("router_aux_loss_coef", 0.0) << "\n";
    }
  }
  if (!hf_is_llama_family(facts.family))
    TRIDENT_REQUIRE(hidden % heads == 0,
                    where << ": the hidden size " << hidden << " is not divisible by the " << heads << " heads");
  TRIDENT_REQUIRE(eps > 0, where << ": the norm epsilon must be > 0");
  TRIDENT_REQUIRE(hd >= 0 && hd < 1 && ad >= 0 && ad < 1, where << ": dropout probabilities must be in [0, 1)");
  if (seq_length == 0) seq_length = positions;
  TRIDENT_REQUIRE(seq_length <= positions, "--seq-length " << seq_length << " is longer than the position table ("
                                                           << positions << " positions in " << where << ")");
  facts.torch_dtype = text_of("torch_dtype", "");
  std::ostringstream ini;
  ini << std::setprecision(17);
  ini << "[model]\nnum_layers = " << layers << "\nhidden_size = " << hidden << "\nnum_heads = " << heads
      << "\nffn_hidden_size = " << ffn << "\nseq_length = " << seq_length << "\nmax_position_embeddings = " << positions
      << "\nvocab_size = " << facts.vocab_size << "\nnorm_epsilon = " << eps << "\ninit_method_std = " << std_init
      << "\nhidden_dropout = " << hd << "\nattention_dropout = " << ad << "\n"
      << extra.str();
  if (facts.model == "bert") ini << "[bert]\nbinary_head = " << (facts.binary_head ? "true" : "false") << "\n";
  ini << moe_ini.str();
  return ini.str();
}

}  // namespace trident
