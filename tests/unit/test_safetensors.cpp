// The safetensors reader and writer (io/safetensors.*) and the Hugging Face layout of Trident's
// models (checkpoint/hf_format.*).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
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

TEST(HfFormat, EveryMappingIsInvertedExactly) {
  for (const std::string model : {"gpt", "bert"}) {
    const auto map = hf_tensor_map(model, 2, true);
    for (const auto& m : map) {
      const std::vector<std::int64_t> shape = m.layout == HfLayout::Same ? std::vector<std::int64_t>{5}
                                                                         : std::vector<std::int64_t>{6, 4};
      std::vector<float> v(static_cast<size_t>(shape.size() == 1 ? 5 : 24));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 3.f;
      const auto hf = to_hf(m, shape, v);
      ASSERT_EQ(hf.size(), m.hf.size()) << m.trident;
      if (m.layout == HfLayout::Transposed) {
        EXPECT_EQ(hf[0].shape, (std::vector<std::int64_t>{4, 6}));
        EXPECT_EQ(hf[0].values[1 * 6 + 2], v[2 * 4 + 1]);  // element (2, 1) at (1, 2)
      }
      if (m.layout == HfLayout::RowThirds) EXPECT_EQ(hf[1].shape, (std::vector<std::int64_t>{2, 4}));
      const auto back = from_hf(m, shape, [&](const std::string& n, const std::vector<std::int64_t>& s) {
        for (const auto& t : hf)
          if (t.name == n) {
            EXPECT_EQ(t.shape, s) << n;
            return t.values;
          }
        ADD_FAILURE() << "no " << n;
        return std::vector<float>{};
      });
      EXPECT_EQ(back, v) << m.trident;
    }
  }
  // GPT-2's names and BERT's query/key/value split
  const auto gpt = hf_tensor_map("gpt", 1, true);
  EXPECT_EQ(gpt[2].trident, "model/layers/0/input_layernorm/weight");
  EXPECT_EQ(gpt[2].hf[0], "transformer.h.0.ln_1.weight");
  const auto bert = hf_tensor_map("bert", 1, false);
  bool split = false, pooler = false;
  for (const auto& m : bert) {
    split |= m.layout == HfLayout::RowThirds && m.hf[2] == "bert.encoder.layer.0.attention.self.value.weight";
    pooler |= m.trident.find("pooler") != std::string::npos;
  }
  EXPECT_TRUE(split);
  EXPECT_FALSE(pooler);  // no binary head: no pooler
  EXPECT_THROW(hf_tensor_map("t5", 1, true), Error);
}

TEST(HfFormat, ConfigsRoundTripAndForeignOptionsAreRefused) {
  Deck d = parse_stored_deck(
      "[model]\nnum_layers = 3\nhidden_size = 48\nnum_heads = 4\nseq_length = 32\nmax_position_embeddings = 40\n"
      "layernorm_epsilon = 1e-6\n");
  HfModelFacts f;
  const std::string ini = deck_from_hf_config(hf_config_json("gpt", d, 500, 499, "float32"), "config.json", 0, f);
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
  const Deck bert = parse_stored_deck(deck_from_hf_config(hf_config_json("bert", d, 300, -1, "float32"), "c", 16, fb));
  EXPECT_EQ(fb.model, "bert");
  EXPECT_NE(hf_config_json("bert", d, 300, -1, "float32").find("MegatronBertForPreTraining"), std::string::npos);
  Deck no_head = d;
  no_head.bert.binary_head = false;
  EXPECT_NE(hf_config_json("bert", no_head, 300, -1, "float32").find("MegatronBertForMaskedLM"), std::string::npos);
  EXPECT_EQ(bert.model.seq_length, 16);
  EXPECT_FALSE(bert.bert.binary_head);

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
  refused(R"({"model_type":"llama"})", "llama");
  refused(R"({"model_type":"gpt2","n_layer":2})", "'n_embd' is missing");
  refused(R"({"model_type":"gpt2","n_layer":-2,"n_embd":8})", "'n_layer' must be a positive integer");
  refused("[1, 2]", "not a JSON object");
}
