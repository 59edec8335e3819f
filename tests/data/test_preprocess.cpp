// The per-rank work of preprocess_data (data/preprocess.*), without MPI: documents of a JSON-lines
// byte range and of a plain-text file go through the GPT-2 tokenizer into shards (an EOD appended,
// empty documents skipped, a new part at --shard-tokens), which read back as the documents'
// tokens; a bad JSON line is an error naming the file and line; expand_inputs sorts a glob and
// refuses a missing file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/preprocess.hpp"
#include "data/token_shard.hpp"
#include "data_test_helpers.hpp"

using namespace trident;
namespace fs = std::filesystem;

namespace {
std::string tmpdir() {
  const fs::path d = fs::temp_directory_path() / ("trident_preprocess_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}
void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
}  // namespace

TEST(Preprocess, WorkerTokenizesRangesAndFilesIntoShards) {
  const std::string sample = test::sample_dir();
  ASSERT_FALSE(sample.empty()) << "set TRIDENT_SAMPLE_DIR to the sample data directory (data/prepare_sample.sh)";
  const std::string d = tmpdir();
  PreprocessOptions o;
  o.tokenizer_type = "GPT2BPETokenizer";
  o.vocab_file = sample + "/gpt2/encoder.json";
  o.merge_file = sample + "/gpt2/vocab.bpe";
  o.output_prefix = d + "/out";
  o.append_eod = true;
  o.shard_tokens = 6;  // a new part once 6 tokens are in
  const auto tok = make_tokenizer(o.tokenizer_type, o.vocab_file, o.merge_file, 0);
  write(d + "/a.jsonl", "{\"text\": \"In the beginning\"}\n{\"text\": \"\"}\n{\"text\": \"God created\"}\n");
  write(d + "/b.txt", "the heaven and the earth");
  const auto inputs = expand_inputs({d + "/*.jsonl", d + "/b.txt"});
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_TRUE(inputs[0].jsonl);
  EXPECT_FALSE(inputs[1].jsonl);
  PreprocessWorker w(o, *tok, 0, 1, inputs[0].size + inputs[1].size);
  w.jsonl_range(inputs[0], 0, inputs[0].size);
  w.plain_file(inputs[1]);
  for (auto& s : w.sinks()) s->finish_shard();
  EXPECT_EQ(w.stats().documents, 3);
  EXPECT_EQ(w.stats().skipped, 1);  // the empty text
  // every document's tokens and the EOD, in input order over the parts
  std::vector<std::int32_t> want;
  for (const char* text : {"In the beginning", "God created", "the heaven and the earth"}) {
    tok->encode_append(text, want);
    want.push_back(tok->eod_id());
  }
  std::vector<std::int32_t> got;
  const auto& parts = w.sinks()[0]->parts();
  EXPECT_GE(parts.size(), 2u);
  for (const auto& p : parts) {
    TokenShardReader r(p);
    std::vector<std::int32_t> t(static_cast<size_t>(r.meta().num_tokens));
    r.read(0, r.meta().num_tokens, t.data());
    got.insert(got.end(), t.begin(), t.end());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(shard_final_name(o.output_prefix, 3), o.output_prefix + "_00003.h5");
  // a bad JSON line names the file and its line
  write(d + "/bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \n");
  const auto bad = expand_inputs({d + "/bad.jsonl"});
  test::expect_error_naming([&] { w.jsonl_range(bad[0], 0, bad[0].size); }, "bad.jsonl:2");
  test::expect_error_naming([&] { expand_inputs({d + "/missing.txt"}); }, "does not exist");
  test::expect_error_naming([&] { expand_inputs({d + "/*.none"}); }, "matches no file");
  for (auto& s : w.sinks()) s->discard();
  fs::remove_all(d);
}
