// The safetensors reader and writer (io/safetensors.*) and the Hugging Face layout of Trident's
// models (checkpoint/hf_format.*).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/hf_format.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "io/deck.hpp"
#include "io/safetensors.hpp"

using namespace trident;
namespace fs = std::filesystem;

namespace {

std::string tmp_path(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("trident_safetensors_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// A file of the given header text and data bytes (the length prefix computed here).
std::string raw_file(const std::string& name, const std::string& header, std::size_t data_bytes) {
  const std::string p = tmp_path(name);
  std::ofstream f(p, std::ios::binary);
  const std::uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f << std::string(data_bytes, '\0');
  return p;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsReader r(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, WriteThenReadGivesTheValuesBackInEachType) {
  std::vector<SafeTensorOut> t = {{"b.weight", {2, 3}, {1.f, -2.5f, 3.25f, 0.f, 1e-3f, 65504.f}},
                                  {"a.bias", {3}, {0.5f, -0.125f, 7.f}}};
  for (const std::string d : {"F32", "BF16", "F16"}) {
    const std::string p = tmp_path("rt_" + d + ".safetensors");
    write_safetensors(p, t, d, {{"format", "pt"}});
    SafetensorsReader r(p);
    ASSERT_EQ(r.tensors().size(), 2u);
    EXPECT_EQ(r.tensors()[0].name, "a.bias");  // name order, back to back
    EXPECT_EQ(r.tensors()[0].begin, 0u);
    EXPECT_EQ(r.metadata().at("format"), "pt");
    const SafeTensorEntry* w = r.find("b.weight");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->dtype, d);
    EXPECT_EQ(w->shape, (std::vector<std::int64_t>{2, 3}));
    const auto v = r.read_f32(*w);
    for (size_t i = 0; i < v.size(); ++i) {
      const float x = t[0].values[i];
      const float want = d == "F32"    ? x
                         : d == "BF16" ? bf16_to_float(float_to_bf16(x))
                                       : fp16_to_float(float_to_fp16(x));
      EXPECT_EQ(v[i], want) << d << " " << i;
    }
    // the data area starts 8-byte aligned
    std::ifstream f(p, std::ios::binary);
    std::uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  }
}

TEST(Safetensors, MalformedHeadersAreErrorsNamingTheFileAndTensor) {
  const std::string ok = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(error_of(raw_file("ok.safetensors", ok, 8)), "");
  std::string e = error_of(raw_file("gap.safetensors", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
  EXPECT_NE(e.find("gap.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  e = error_of(raw_file("overlap.safetensors",
                        R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8));
  EXPECT_NE(e.find("overlapping"), std::string::npos) << e;
  e = error_of(raw_file("past.safetensors", ok, 4));
  EXPECT_NE(e.find("outside"), std::string::npos) << e;
  e = error_of(raw_file("tail.safetensors", ok, 12));
  EXPECT_NE(e.find("after the last tensor"), std::string::npos) << e;
  e = error_of(raw_file("size.safetensors", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(e.find("8 bytes for 3 F32 values"), std::string::npos) << e;
  e = error_of(raw_file("dtype.safetensors", R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(e.find("unknown dtype 'Q7'"), std::string::npos) << e;
  e = error_of(raw_file("json.safetensors", "{\"x\":", 8));
  EXPECT_NE(e.find("not JSON"), std::string::npos) << e;
  e = error_of(raw_file("neg.safetensors", R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(e.find("not a non-negative integer"), std::string::npos) << e;
  // a header length beyond the file
  const std::string p = tmp_path("long.safetensors");
  {
    std::ofstream f(p, std::ios::binary);
    const std::uint64_t n = 1u << 20;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  e = error_of(p);
  EXPECT_NE(e.find("exceeds the file"), std::string::npos) << e;
  // an I64 tensor is read as a tensor but not converted
  SafetensorsReader r(raw_file("i64.safetensors", R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  try {
    r.read_f32(*r.find("x"));
    FAIL() << "I64 read as fp32";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("I64"), std::string::npos);
  }
}

TEST(Safetensors, StreamedWriterGivesTheBytesOfTheOneCallWriterAndPartialReads) {
  // two tensors, values given in uneven parts across the tensors' boundary, bf16 and fp32
  const std::vector<SafeTensorOut> ts = {{"b", {3, 2}, {1.f, -2.f, 3.5f, 4.f, 5.f, 1e-3f}},
                                         {"a", {4}, {0.1f, 0.2f, -0.3f, 65504.f}}};
  for (const std::string dt : {"F32", "BF16"}) {
    const std::string one = tmp_path("one_" + dt + ".safetensors"), streamed = tmp_path("str_" + dt + ".safetensors");
    write_safetensors(one, ts, dt, {{"format", "pt"}});
    {
      SafetensorsWriter w(streamed, {{"b", {3, 2}}, {"a", {4}}}, dt, {{"format", "pt"}});
      ASSERT_EQ(w.order()[0].name, "a");  // name order
      std::vector<float> all = ts[1].values;
      all.insert(all.end(), ts[0].values.begin(), ts[0].values.end());
      w.put(all.data(), 3);
      w.put(all.data() + 3, 5);  // ends "a", starts "b"
      w.put(all.data() + 8, 2);
      w.commit();
      EXPECT_EQ(w.data_bytes(), 10u * (dt == "F32" ? 4 : 2));
    }
    std::ifstream x(one, std::ios::binary), y(streamed, std::ios::binary);
    const std::string bx((std::istreambuf_iterator<char>(x)), {}), by((std::istreambuf_iterator<char>(y)), {});
    EXPECT_EQ(bx, by) << dt;
    SafetensorsReader r(streamed);
    float part[3];
    r.read_f32(*r.find("b"), 2, 3, part);  // elements 2..4 of b
    EXPECT_EQ(part[0], dt == "F32" ? 3.5f : bf16_to_float(float_to_bf16(3.5f)));
    EXPECT_EQ(part[2], 5.f);
    EXPECT_THROW(r.read_f32(*r.find("b"), 4, 3, part), Error);  // past its 6 values
  }
  // too many or too few values: an error, and no file left behind
  const std::string bad = tmp_path("bad.safetensors");
  {
    SafetensorsWriter w(bad, {{"x", {2}}}, "F32", {});
    const float v[3] = {1, 2, 3};
    EXPECT_THROW(w.put(v, 3), Error);
  }
  EXPECT_FALSE(fs::exists(bad) || fs::exists(bad + ".tmp"));
  {
    SafetensorsWriter w(bad, {{"x", {2}}}, "F32", {});
    const float v[1] = {1};
    w.put(v, 1);
    EXPECT_THROW(w.commit(), Error);
  }
  EXPECT_FALSE(fs::exists(bad) || fs::exists(bad + ".tmp"));
}

TEST(Safetensors, ShardsFollowHuggingFacesRuleAndSizesParse) {
  const std::vector<SafeTensorSpec> t = {{"a", {10}}, {"b", {10}}, {"c", {30}}, {"d", {5}}};
  // 4-byte values: 40, 40, 120, 20 bytes; at most 100 per shard -> {a, b}, {c} (alone: too big), {d}
  const auto g = plan_safetensors_shards(t, 4, 100);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0], (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(g[1], (std::pair<size_t, size_t>{2, 3}));
  EXPECT_EQ(g[2], (std::pair<size_t, size_t>{3, 4}));
  EXPECT_EQ(plan_safetensors_shards(t, 4, 0).size(), 1u);
  EXPECT_EQ(safetensors_shard_name(0, 1), "model.safetensors");
  EXPECT_EQ(safetensors_shard_name(1, 3), "model-00002-of-00003.safetensors");
  EXPECT_EQ(parse_byte_size("5GB", "x"), 5000000000ull);
  EXPECT_EQ(parse_byte_size("2GiB", "x"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("300", "x"), 300ull);
  EXPECT_THROW(parse_byte_size("5XB", "x"), Error);
  EXPECT_THROW(parse_byte_size("-5", "x"), Error);
  EXPECT_NE(safetensors_index_json({{"w", "model-00001-of-00002.safetensors"}}, 96).find("\"total_size\": 96"),
            std::string::npos);
}

namespace {
// A Llama-family deck: 2 layers, hidden 16, 4 heads in 2 groups, untied, no biases; `extra`'s
// "key = value" lines replace or add keys.
Deck llama_deck(const std::string& extra) {
  std::map<std::string, std::string> keys = {{"num_layers", "2"},
                                             {"hidden_size", "16"},
                                             {"num_heads", "4"},
                                             {"num_query_groups", "2"},
                                             {"ffn_hidden_size", "24"},
                                             {"seq_length", "8"},
                                             {"max_position_embeddings", "32"},
                                             {"normalization", "RMSNorm"},
                                             {"position_embedding_type", "rope"},
                                             {"swiglu", "true"},
                                             {"add_bias_linear", "false"},
                                             {"untie_embeddings_and_output_weights", "true"}};
  std::istringstream in(extra);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) keys[line.substr(0, eq)] = line.substr(eq + 3);
  }
  std::string ini = "[model]\n";
  for (const auto& [k, v] : keys) ini += k + " = " + v + "\n";
  return parse_stored_deck(ini);
}
}  // namespace

TEST(HfFormat, MapsNameEveryTensorWithItsShapes) {
  const Deck gpt = parse_stored_deck(
      "[model]\nnum_layers = 1\nhidden_size = 8\nnum_heads = 2\nseq_length = 4\nmax_position_embeddings = 6\n");
  const auto g = hf_tensor_map(HfFamily::Gpt2, gpt, 11);
  EXPECT_EQ(g[2].trident, "model/layers/0/input_layernorm/weight");
  EXPECT_EQ(g[2].hf[0], "transformer.h.0.ln_1.weight");
  EXPECT_EQ(g[0].shape, (std::vector<std::int64_t>{11, 8}));
  EXPECT_EQ(g[4].layout, HfLayout::Transposed);
  EXPECT_EQ(g[4].hf_shape(0), (std::vector<std::int64_t>{8, 24}));  // c_attn [in, out]
  Deck bert = gpt;
  bert.bert.binary_head = false;
  bool split = false, pooler = false;
  for (const auto& m : hf_tensor_map(HfFamily::MegatronBert, bert, 11)) {
    split |= m.layout == HfLayout::RowBlocks && m.hf[2] == "bert.encoder.layer.0.attention.self.value.weight" &&
             m.hf_shape(2) == std::vector<std::int64_t>{8, 8} && m.row0(2) == 16;
    pooler |= m.trident.find("pooler") != std::string::npos;
  }
  EXPECT_TRUE(split);
  EXPECT_FALSE(pooler);  // no binary head: no pooler
  // Llama: q|k|v as unequal blocks (4 heads of 4, 2 groups), gate|up, the untied head
  const auto l = hf_tensor_map(HfFamily::Llama, llama_deck(""), 11);
  std::map<std::string, HfTensor> by;
  for (const auto& m : l) by[m.trident] = m;
  const HfTensor& qkv = by.at("model/layers/1/self_attention/qkv/weight");
  EXPECT_EQ(qkv.hf, (std::vector<std::string>{"model.layers.1.self_attn.q_proj.weight",
                                              "model.layers.1.self_attn.k_proj.weight",
                                              "model.layers.1.self_attn.v_proj.weight"}));
  EXPECT_EQ(qkv.rows, (std::vector<std::int64_t>{16, 8, 8}));
  EXPECT_EQ(qkv.shape, (std::vector<std::int64_t>{32, 16}));
  const HfTensor& fc1 = by.at("model/layers/0/mlp/fc1/weight");
  EXPECT_EQ(fc1.hf[0], "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(fc1.row0(1), 24);
  EXPECT_EQ(by.at("model/output_layer/weight").hf[0], "lm_head.weight");
  EXPECT_FALSE(by.count("model/layers/0/self_attention/qkv/bias"));
  EXPECT_FALSE(by.count("model/embedding/position_embeddings"));
  // Qwen 3: q/k norms of the head size; Qwen 2: q/k/v biases only; Llama with biases: all
  std::set<std::string> q3, q2, lb;
  for (const auto& m : hf_tensor_map(HfFamily::Qwen3, llama_deck("kv_channels = 6\nqk_layernorm = true\n"), 11))
    for (const auto& h : m.hf) q3.insert(h);
  EXPECT_TRUE(q3.count("model.layers.0.self_attn.k_norm.weight"));
  for (const auto& m : hf_tensor_map(HfFamily::Qwen2, llama_deck("add_qkv_bias = true\n"), 11))
    for (const auto& h : m.hf) q2.insert(h);
  EXPECT_TRUE(q2.count("model.layers.0.self_attn.v_proj.bias"));
  EXPECT_FALSE(q2.count("model.layers.0.self_attn.o_proj.bias"));
  for (const auto& m : hf_tensor_map(HfFamily::Llama, llama_deck("add_bias_linear = true\n"), 11))
    for (const auto& h : m.hf) lb.insert(h);
  EXPECT_TRUE(lb.count("model.layers.0.self_attn.o_proj.bias") && lb.count("model.layers.0.mlp.down_proj.bias"));
}

TEST(HfFormat, ExportFamilyFollowsTheDeckAndRefusesWhatItCannotHold) {
  EXPECT_EQ(hf_export_family("gpt", llama_deck(""), ""), HfFamily::Llama);
  EXPECT_EQ(hf_export_family("gpt", llama_deck("qk_layernorm = true\n"), ""), HfFamily::Qwen3);
  EXPECT_EQ(hf_export_family("gpt", llama_deck("add_qkv_bias = true\n"), ""), HfFamily::Qwen2);
  EXPECT_EQ(hf_export_family("gpt", llama_deck(""), "mistral"), HfFamily::Mistral);
  EXPECT_EQ(hf_export_family("bert", llama_deck(""), ""), HfFamily::MegatronBert);
  auto refused = [](const Deck& d, const std::string& fam, const std::string& needle) {
    try {
      hf_export_family("gpt", d, fam);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted as " << fam;
  };
  refused(llama_deck("add_bias_linear = true\n"), "mistral", "Mistral has none");
  refused(llama_deck(""), "qwen3", "q/k norms");
  refused(llama_deck("normalization = LayerNorm\n"), "", "model.normalization = LayerNorm");
  refused(llama_deck("rotary_percent = 0.5\n"), "", "rotary_percent");
  refused(llama_deck(""), "gpt2", "Llama family");
  refused(llama_deck("qk_layernorm = true\nadd_bias_linear = true\n"), "", "cannot express");
  refused(llama_deck(""), "t5", "not converted");
}

TEST(HfFormat, ConfigsRoundTripAndForeignOptionsAreRefused) {
  Deck d = parse_stored_deck(
      "[model]\nnum_layers = 3\nhidden_size = 48\nnum_heads = 4\nseq_length = 32\nmax_position_embeddings = 40\n"
      "layernorm_epsilon = 1e-6\n");
  HfModelFacts f;
  const std::string ini = deck_from_hf_config(hf_config_json(HfFamily::Gpt2, d, 500, 499, "float32"), "config.json", 0,
                                              f);
  EXPECT_EQ(f.model, "gpt");
  EXPECT_EQ(f.vocab_size, 500);
  EXPECT_EQ(f.eod, 499);
  const Deck back = parse_stored_deck(ini);
  EXPECT_EQ(back.model.num_layers, 3);
  EXPECT_EQ(back.model.hidden_size, 48);
  EXPECT_EQ(back.model.ffn_hidden_size, 192);
  EXPECT_EQ(back.model.max_position_embeddings, 40);
  EXPECT_EQ(back.model.seq_length, 40);  // the position table's length unless given
  EXPECT_EQ(back.model.norm_epsilon, 1e-6);
  EXPECT_EQ(back.model.vocab_size, 500);
  HfModelFacts fb;
  fb.binary_head = false;
  const Deck bert = parse_stored_deck(
      deck_from_hf_config(hf_config_json(HfFamily::MegatronBert, d, 300, -1, "float32"), "c", 16, fb));
  EXPECT_EQ(fb.model, "bert");
  EXPECT_NE(hf_config_json(HfFamily::MegatronBert, d, 300, -1, "float32").find("MegatronBertForPreTraining"),
            std::string::npos);
  Deck no_head = d;
  no_head.bert.binary_head = false;
  EXPECT_NE(hf_config_json(HfFamily::MegatronBert, no_head, 300, -1, "float32").find("MegatronBertForMaskedLM"),
            std::string::npos);
  EXPECT_EQ(bert.model.seq_length, 16);
  EXPECT_FALSE(bert.bert.binary_head);
  // the Llama family: every architecture key survives export -> import
  for (const auto& [fam, extra] : std::vector<std::pair<HfFamily, std::string>>{
           {HfFamily::Llama, "use_rope_scaling = true\nrope_scaling_factor = 8\nrotary_base = 500000\n"},
           {HfFamily::Llama, "add_bias_linear = true\nkv_channels = 6\n"},
           {HfFamily::Mistral, "norm_epsilon = 1e-5\n"},
           {HfFamily::Qwen2, "add_qkv_bias = true\nuntie_embeddings_and_output_weights = false\n"},
           {HfFamily::Qwen3, "qk_layernorm = true\nkv_channels = 8\n"}}) {
    const Deck src = llama_deck(extra);
    HfModelFacts lf;
    const Deck dst = parse_stored_deck(
        deck_from_hf_config(hf_config_json(fam, src, 77, 76, "bfloat16"), "config.json", 8, lf));
    SCOPED_TRACE(hf_model_type(fam) + std::string(" ") + extra);
    EXPECT_EQ(lf.family, fam);
    EXPECT_EQ(lf.model, "gpt");
    EXPECT_EQ(lf.eod, 76);
    const auto &a = src.model, &b = dst.model;
    EXPECT_EQ(b.num_layers, a.num_layers);
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.num_heads, a.num_heads);
    EXPECT_EQ(b.groups(), a.groups());
    EXPECT_EQ(b.head_dim(), a.head_dim());
    EXPECT_EQ(b.ffn_hidden_size, a.ffn_hidden_size);
    EXPECT_EQ(b.normalization, "RMSNorm");
    EXPECT_EQ(b.position_embedding_type, "rope");
    EXPECT_TRUE(b.swiglu);
    EXPECT_EQ(b.rotary_base, a.rotary_base);
    EXPECT_EQ(b.use_rope_scaling, a.use_rope_scaling);
    EXPECT_EQ(b.rope_scaling_factor, a.rope_scaling_factor);
    EXPECT_EQ(b.norm_epsilon, a.norm_epsilon);
    EXPECT_EQ(b.add_bias_linear, a.add_bias_linear);
    EXPECT_EQ(b.add_qkv_bias, a.add_qkv_bias);
    EXPECT_EQ(b.qk_layernorm, a.qk_layernorm);
    EXPECT_EQ(b.untie_embeddings_and_output_weights, a.untie_embeddings_and_output_weights);
    EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
  }

  auto refused = [](const std::string& json, const std::string& needle, std::int64_t seq = 0) {
    HfModelFacts x;
    try {
      deck_from_hf_config(json, "cfg.json", seq, x);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << json;
  };
  const std::string g = R"("model_type":"gpt2","n_layer":2,"n_embd":8,"n_head":2,"n_positions":16,"vocab_size":10)";
  refused("{" + g + R"(,"activation_function":"relu"})", "activation_function");
  refused("{" + g + R"(,"tie_word_embeddings":false})", "tie_word_embeddings");
  refused("{" + g + R"(,"scale_attn_by_inverse_layer_idx":true})", "scale_attn_by_inverse_layer_idx");
  refused("{" + g + "}", "longer than the position table", 17);
  refused(R"({"model_type":"bert","num_hidden_layers":2})", "megatron-bert");
  refused(R"({"model_type":"gemma"})", "not converted");
  refused(R"({"model_type":"gpt2","n_layer":2})", "'n_embd' is missing");
  refused(R"({"model_type":"gpt2","n_layer":-2,"n_embd":8})", "'n_layer' must be a positive integer");
  refused("[1, 2]", "not a JSON object");
  const std::string l = R"("num_hidden_layers":2,"hidden_size":8,"num_attention_heads":2,"intermediate_size":12,)"
                        R"("max_position_embeddings":16,"vocab_size":10)";
  refused(R"({"model_type":"llama",)" + l + R"(,"hidden_act":"gelu"})", "hidden_act");
  refused(R"({"model_type":"llama",)" + l + R"(,"rope_scaling":{"rope_type":"yarn","factor":4}})", "yarn");
  refused(R"({"model_type":"llama",)" + l + R"(,"attention_bias":true,"mlp_bias":false})", "add_bias_linear");
  refused(R"({"model_type":"mistral",)" + l + R"(,"sliding_window":4})", "sliding-window");
  refused(R"({"model_type":"qwen2",)" + l + R"(,"use_sliding_window":true})", "sliding-window");
  refused(R"({"model_type":"qwen3",)" + l + R"(,"attention_bias":true})", "attention_bias");
  refused(R"({"model_type":"llama",)" + l + R"(,"num_key_value_heads":3})", "not a multiple");
  refused(R"({"model_type":"llama",)" + l + R"(,"partial_rotary_factor":0.5})", "partial_rotary_factor");
}
