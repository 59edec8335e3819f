#include "checkpoint/hf_format.hpp"

#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"

namespace trident {

namespace {

std::string str(std::int64_t i) { return std::to_string(i); }

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + str(s[i]);
  return t + "]";
}

}  // namespace

std::vector<HfTensor> hf_tensor_map(const std::string& model, std::int64_t num_layers, bool binary_head) {
  std::vector<HfTensor> m;
  auto add = [&](const std::string& t, const std::string& h, HfLayout l = HfLayout::Same) { m.push_back({t, {h}, l}); };
  auto wb = [&](const std::string& t, const std::string& h, HfLayout weight_layout = HfLayout::Same) {
    add(t + "/weight", h + ".weight", weight_layout);
    add(t + "/bias", h + ".bias");
  };
  if (model == "gpt") {
    const std::string p = "transformer.";
    add("model/embedding/word_embeddings", p + "wte.weight");
    add("model/embedding/position_embeddings", p + "wpe.weight");
    for (std::int64_t i = 0; i < num_layers; ++i) {
      const std::string t = "model/layers/" + str(i) + "/", h = p + "h." + str(i) + ".";
      wb(t + "input_layernorm", h + "ln_1");
      wb(t + "self_attention/qkv", h + "attn.c_attn", HfLayout::Transposed);
      wb(t + "self_attention/proj", h + "attn.c_proj", HfLayout::Transposed);
      wb(t + "post_attention_layernorm", h + "ln_2");
      wb(t + "mlp/fc1", h + "mlp.c_fc", HfLayout::Transposed);
      wb(t + "mlp/fc2", h + "mlp.c_proj", HfLayout::Transposed);
    }
    wb("model/final_layernorm", p + "ln_f");
    return m;
  }
  if (model == "bert") {
    add("model/embedding/word_embeddings", "bert.embeddings.word_embeddings.weight");
    add("model/embedding/position_embeddings", "bert.embeddings.position_embeddings.weight");
    add("model/embedding/tokentype_embeddings", "bert.embeddings.token_type_embeddings.weight");
    for (std::int64_t i = 0; i < num_layers; ++i) {
      const std::string t = "model/layers/" + str(i) + "/", h = "bert.encoder.layer." + str(i) + ".";
      wb(t + "input_layernorm", h + "attention.ln");
      for (const char* part : {"weight", "bias"})
        m.push_back(
            {t + "self_attention/qkv/" + part,
             {h + "attention.self.query." + part, h + "attention.self.key." + part, h + "attention.self.value." + part},
             HfLayout::RowThirds});
      wb(t + "self_attention/proj", h + "attention.output.dense");
      wb(t + "post_attention_layernorm", h + "ln");
      wb(t + "mlp/fc1", h + "intermediate.dense");
      wb(t + "mlp/fc2", h + "output.dense");
    }
    wb("model/final_layernorm", "bert.encoder.ln");
    wb("model/lm_head/dense", "cls.predictions.transform.dense");
    wb("model/lm_head/layernorm", "cls.predictions.transform.LayerNorm");
    add("model/lm_head/bias", "cls.predictions.bias");
    if (binary_head) {
      wb("model/pooler/dense", "bert.pooler.dense");
      wb("model/binary_head", "cls.seq_relationship");
    }
    return m;
  }
  throw Error::all("Hugging Face format: model kind '" + model + "' has no mapping (gpt and bert have)");
}

std::vector<SafeTensorOut> to_hf(const HfTensor& m, const std::vector<std::int64_t>& shape,
                                 const std::vector<float>& v) {
  if (m.layout == HfLayout::Same) return {{m.hf[0], shape, v}};
  if (m.layout == HfLayout::Transposed) {
    TRIDENT_REQUIRE(shape.size() == 2, m.trident << ": a transposed tensor must be 2-D, not " << shape_text(shape));
    const std::int64_t r = shape[0], c = shape[1];
    std::vector<float> t(v.size());
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c; ++j) t[j * r + i] = v[i * c + j];
    return {{m.hf[0], {c, r}, std::move(t)}};
  }
  TRIDENT_REQUIRE(!shape.empty() && shape[0] % 3 == 0,
                  m.trident << ": " << shape_text(shape) << " is not 3 blocks of rows");
  std::vector<std::int64_t> part = shape;
  part[0] /= 3;
  const size_t n = v.size() / 3;
  std::vector<SafeTensorOut> out;
  for (size_t b = 0; b < 3; ++b)
    out.push_back({m.hf[b], part, std::vector<float>(v.begin() + b * n, v.begin() + (b + 1) * n)});
  return out;
}

std::vector<float> from_hf(
    const HfTensor& m, const std::vector<std::int64_t>& shape,
    const std::function<std::vector<float>(const std::string&, const std::vector<std::int64_t>&)>& get) {
  if (m.layout == HfLayout::Same) return get(m.hf[0], shape);
  if (m.layout == HfLayout::Transposed) {
    const std::int64_t r = shape[0], c = shape[1];
    const std::vector<float> t = get(m.hf[0], {c, r});
    std::vector<float> v(t.size());
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c; ++j) v[i * c + j] = t[j * r + i];
    return v;
  }
  std::vector<std::int64_t> part = shape;
  part[0] /= 3;
  std::vector<float> v;
  for (size_t b = 0; b < 3; ++b) {
    const std::vector<float> t = get(m.hf[b], part);
    v.insert(v.end(), t.begin(), t.end());
  }
  return v;
}

std::string hf_config_json(const std::string& model, const Deck& d, std::int64_t vocab, std::int64_t eod,
                           const std::string& dtype) {
  const auto& md = d.model;
  nlohmann::ordered_json c;
  if (model == "gpt") {
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
  } else if (model == "bert") {
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
    throw Error::all("Hugging Face format: model kind '" + model + "' has no mapping (gpt and bert have)");
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
  const std::string type = text_of("model_type", "");
  TRIDENT_REQUIRE(!type.empty(), where << ": 'model_type' is missing (gpt2 and megatron-bert are converted)");
  auto activation = [&](const char* k, const std::string& def) {
    const std::string a = text_of(k, def);
    TRIDENT_REQUIRE(a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast",
                    where << ": '" << k << "' is '" << a
                          << "': Trident's models compute GELU's tanh approximation only (gelu_new)");
  };
  TRIDENT_REQUIRE(flag("tie_word_embeddings", true),
                  where << ": 'tie_word_embeddings' is false: Trident's output layer is the word embeddings (tied)");
  std::int64_t layers = 0, hidden = 0, heads = 0, ffn = 0, positions = 0;
  double eps = 1e-5, std_init = 0.02, hd = 0.1, ad = 0.1;
  if (type == "gpt2") {
    facts.model = "gpt";
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
    if (has("eos_token_id")) {
      TRIDENT_REQUIRE(c["eos_token_id"].is_number_integer(), where << ": 'eos_token_id' must be an integer");
      facts.eod = c["eos_token_id"].get<std::int64_t>();
    }
  } else if (type == "megatron-bert") {
    facts.model = "bert";
    layers = integer("num_hidden_layers");
    hidden = integer("hidden_size");
    heads = integer("num_attention_heads");
    ffn = integer("intermediate_size");
    positions = integer("max_position_embeddings");
    facts.vocab_size = integer("vocab_size");
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
  } else if (type == "bert") {
    throw Error::all(where +
                     ": model_type 'bert' (BertForPreTraining) normalizes after each residual add and on the "
                     "embeddings; Trident's BERT is Megatron's (pre-LayerNorm): convert megatron-bert "
                     "(MegatronBertForPreTraining) checkpoints");
  } else {
    throw Error::all(where + ": model_type '" + type + "' is not converted (gpt2 and megatron-bert are)");
  }
  TRIDENT_REQUIRE(hidden % heads == 0,
                  where << ": the hidden size " << hidden << " is not divisible by the " << heads << " heads");
  TRIDENT_REQUIRE(eps > 0, where << ": the LayerNorm epsilon must be > 0");
  TRIDENT_REQUIRE(hd >= 0 && hd < 1 && ad >= 0 && ad < 1, where << ": dropout probabilities must be in [0, 1)");
  if (seq_length == 0) seq_length = positions;
  TRIDENT_REQUIRE(seq_length <= positions, "--seq-length " << seq_length << " is longer than the position table ("
                                                           << positions << " positions in " << where << ")");
  facts.torch_dtype = text_of("torch_dtype", "");
  std::ostringstream ini;
  ini << std::setprecision(17);
  ini << "[model]\nnum_layers = " << layers << "\nhidden_size = " << hidden << "\nnum_heads = " << heads
      << "\nffn_hidden_size = " << ffn << "\nseq_length = " << seq_length << "\nmax_position_embeddings = " << positions
      << "\nvocab_size = " << facts.vocab_size << "\nlayernorm_epsilon = " << eps << "\ninit_method_std = " << std_init
      << "\nhidden_dropout = " << hd << "\nattention_dropout = " << ad << "\n";
  if (facts.model == "bert") ini << "[bert]\nbinary_head = " << (facts.binary_head ? "true" : "false") << "\n";
  return ini.str();
}

}  // namespace trident
