// The parts of data/hf_tokenizer that the comparison with the JavaScript library
// (compare_hf_tokenizers.py, on the real Llama 2, Llama 3 and Qwen 3 files) does not reach, on
// small tokenizer.json files written here: byte fallback, the unknown token and fuse_unk,
// ignore_merges, added tokens with lstrip / rstrip / single_word and normalized matching, Metaspace
// and its decoder, the template post-processor, the split behaviours, and the refusals; and the
// helpers: SHA-256 (FIPS 180-4 test vectors), the WHATWG decoding of invalid UTF-8, the digest.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/sha256.hpp"
#include "data/hf_tokenizer.hpp"
#include "data_test_helpers.hpp"

using namespace trident;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
std::string write_tokenizer(const std::string& name, const json& j, const json* config = nullptr) {
  const fs::path d = fs::temp_directory_path() / ("trident_hf_" + std::to_string(::getpid())) / name;
  fs::create_directories(d);
  std::ofstream(d / "tokenizer.json") << j.dump();
  if (config) std::ofstream(d / "tokenizer_config.json") << config->dump();
  return (d / "tokenizer.json").string();
}

// A BPE over single characters a, b, c, space with merges "a b" and "ab c".
json small_bpe() {
  json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"<unk>", 5}, {" ", 6}};
  return json{{"model",
               {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", {"a b", "ab c"}},
                {"unk_token", "<unk>"},
                {"byte_fallback", false},
                {"fuse_unk", false}}},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr}};
}
}  // namespace

TEST(HfTokenizer, Sha256GivesTheStandardsTestVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HfTokenizer, InvalidUtf8IsDecodedAsWhatwgDecodes) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(sanitize_utf8("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");  // valid: unchanged
  EXPECT_EQ(sanitize_utf8("\xC3\x28"), r + "(");                           // the breaking byte read again
  EXPECT_EQ(sanitize_utf8("a\xE2\x82"), "a" + r);                          // truncated at the end: one
  EXPECT_EQ(sanitize_utf8("\xF0\x80\x80\x80"), r + r + r + r);             // F0 80: not a continuation
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), r + r + r);                     // an encoded surrogate
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), r + r + r + r);             // above U+10FFFF
  EXPECT_EQ(sanitize_utf8("\xC0\xAF\xFE\xFF"), r + r + r + r);             // overlong, FE, FF
  EXPECT_EQ(sanitize_utf8("\xE2\x82\xAC\xE2\x82"), "\xE2\x82\xAC" + r);
}

TEST(HfTokenizer, BpeMergesUnknownsByteFallbackAndIgnoreMerges) {
  json j = small_bpe();
  HfTokenizer t(write_tokenizer("bpe", j));
  EXPECT_EQ(t.encode("abc"), (std::vector<std::int32_t>{4}));
  EXPECT_EQ(t.encode("abab"), (std::vector<std::int32_t>{3, 3}));
  EXPECT_EQ(t.encode("xxa"), (std::vector<std::int32_t>{5, 5, 0}));  // no fuse: one <unk> per character
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(HfTokenizer(write_tokenizer("fuse", j)).encode("xxa"), (std::vector<std::int32_t>{5, 0}));
  // byte fallback: the bytes of an unknown character as <0xNN> tokens
  j["model"]["byte_fallback"] = true;
  j["model"]["vocab"]["<0xC3>"] = 7;
  j["model"]["vocab"]["<0xA9>"] = 8;
  HfTokenizer bf(write_tokenizer("fallback", j));
  EXPECT_EQ(bf.encode("\xC3\xA9"
                      "ab"),
            (std::vector<std::int32_t>{7, 8, 3}));            // é: C3 A9
  EXPECT_EQ(bf.encode("z"), (std::vector<std::int32_t>{5}));  // no <0x7A>: <unk>
  // ignore_merges: a word in the vocabulary is its token, whatever the merges would make
  j = small_bpe();
  j["model"]["vocab"]["bc"] = 9;
  j["model"]["merges"] = {"b c", "a bc"};
  j["model"]["vocab"]["abc"] = 4;
  j["model"]["merges"] = {"b c"};
  EXPECT_EQ(HfTokenizer(write_tokenizer("merges", j)).encode("abc"), (std::vector<std::int32_t>{0, 9}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(HfTokenizer(write_tokenizer("ignore", j)).encode("abc"), (std::vector<std::int32_t>{4}));
}

TEST(HfTokenizer, AddedTokensMatchFirstWithTheirOptions) {
  json j = small_bpe();
  j["added_tokens"] = {
      {{"id", 10}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 11}, {"content", "<sep>"}, {"special", true}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}},
      {{"id", 12}, {"content", "ab"}, {"special", false}, {"normalized", false}, {"single_word", true}},
      {{"id", 13}, {"content", "<s>x"}, {"special", false}, {"normalized", false}}};
  HfTokenizer t(write_tokenizer("added", j));
  EXPECT_EQ(t.vocab_size(), 14);
  EXPECT_EQ(t.encode("a<s>b"), (std::vector<std::int32_t>{0, 10, 1}));
  EXPECT_EQ(t.encode("<s>xa"), (std::vector<std::int32_t>{13, 0}));           // the longest match
  EXPECT_EQ(t.encode("a  <sep>  b"), (std::vector<std::int32_t>{0, 11, 1}));  // white space taken by l/rstrip
  EXPECT_EQ(t.encode("ab c"), (std::vector<std::int32_t>{12, 6, 2}));         // a whole word: the added token
  EXPECT_EQ(t.encode("abc"), (std::vector<std::int32_t>{4}));                 // inside a word: not matched
  // normalized: true tokens match after the normalizer
  json k = small_bpe();
  k["normalizer"] = {{"type", "Lowercase"}};
  k["added_tokens"] = {{{"id", 20}, {"content", "cab"}, {"special", false}, {"normalized", true}}};
  EXPECT_EQ(HfTokenizer(write_tokenizer("normalized", k)).encode("aCABb"), (std::vector<std::int32_t>{0, 20, 1}));
}

TEST(HfTokenizer, MetaspaceTemplateAndDecodersRoundTrip) {
  const std::string m = "\xE2\x96\x81";  // U+2581
  json vocab = {{"<s>", 0}, {"</s>", 1}, {m + "hello", 2}, {m + "world", 3}, {m, 4}, {"h", 5}, {"e", 6}};
  json j{
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"unk_token", nullptr}, {"ignore_merges", true}}},
      {"added_tokens",
       {{{"id", 0}, {"content", "<s>"}, {"special", true}}, {{"id", 1}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}, {"split", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}}}, {"</s>", {{"id", "</s>"}, {"ids", {1}}}}}}}},
      {"decoder", {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}}}};
  json cfg{{"eos_token", "</s>"}, {"bos_token", {{"content", "<s>"}}}};
  HfTokenizer t(write_tokenizer("metaspace", j, &cfg));
  EXPECT_EQ(t.encode("hello world"), (std::vector<std::int32_t>{0, 2, 3, 1}));
  std::vector<std::int32_t> plain;
  t.encode_append("hello world", plain, false);
  EXPECT_EQ(plain, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(t.decode(plain), "hello world");
  EXPECT_EQ(t.decode({0, 2, 3, 1}, true), "hello world");
  EXPECT_EQ(t.specials().eod, 1);
  EXPECT_EQ(t.specials().bos, 0);
  EXPECT_FALSE(t.continues_word(3));  // starts a word (U+2581)
  EXPECT_EQ(t.files().size(), 2u);    // the tokenizer and its config name the digest
}

TEST(HfTokenizer, SplitBehaviours) {
  // every character its own token and merges that would join anything: the splits are what stops them
  json vocab = {{"a", 0}, {",", 1}, {"a,", 2}, {",a", 3}, {",,", 4}, {"a,,", 5}, {",,a", 6}};
  json merges = {"a ,", ", a", ", ,", "a, ,", ",, a"};
  auto with = [&](const std::string& behavior) {
    json j{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
           {"added_tokens", json::array()},
           {"pre_tokenizer",
            {{"type", "Split"}, {"pattern", {{"String", ","}}}, {"behavior", behavior}, {"invert", false}}}};
    return HfTokenizer(write_tokenizer("split_" + behavior, j)).encode("a,,a");
  };
  EXPECT_EQ(with("Removed"), (std::vector<std::int32_t>{0, 0}));                // a | a
  EXPECT_EQ(with("Isolated"), (std::vector<std::int32_t>{0, 1, 1, 0}));         // a | , | , | a
  EXPECT_EQ(with("MergedWithPrevious"), (std::vector<std::int32_t>{2, 1, 0}));  // a, | , | a
  EXPECT_EQ(with("MergedWithNext"), (std::vector<std::int32_t>{0, 1, 3}));      // a | , | ,a
  EXPECT_EQ(with("Contiguous"), (std::vector<std::int32_t>{0, 4, 0}));          // a | ,, | a
}

TEST(HfTokenizer, WhatIsNotImplementedIsRefusedNamingIt) {
  auto refused = [](const std::string& name, json j, const std::string& needle) {
    test::expect_error_naming([&] { HfTokenizer t(write_tokenizer(name, j)); }, needle);
  };
  json j = small_bpe();
  j["model"]["type"] = "Unigram";
  refused("unigram", j, "model type 'Unigram' is not implemented");
  j = small_bpe();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  refused("bertnorm", j, "normalizer 'BertNormalizer' is not implemented");
  j = small_bpe();
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  refused("scripts", j, "pre_tokenizer 'UnicodeScripts' is not implemented");
  j = small_bpe();
  j["decoder"] = {{"type", "CTC"}};
  refused("ctc", j, "decoder 'CTC' is not implemented");
  j = small_bpe();
  j["model"]["dropout"] = 0.1;
  refused("dropout", j, "BPE dropout");
  j = small_bpe();
  j["model"]["merges"] = {"a q"};
  refused("merge", j, "names a token not in the vocabulary");
  j = small_bpe();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  refused("regex", j, "does not compile");
  test::expect_error_naming([] { HfTokenizer t("/nonexistent/tokenizer.json"); }, "cannot read");
}
