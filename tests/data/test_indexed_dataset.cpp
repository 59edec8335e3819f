// IndexedDatasetWriter / IndexedDatasetReader (Megatron .bin/.idx): round trips in every integer
// dtype, empty documents and sentences, the value range of each dtype, the temporary-name
// protocol, prefix detection, and a TokenShardReader over a pair (offsets, sentences, the deck's
// tokenizer). Malformed pairs are covered by tests/data/check_megatron.py errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "common/error.hpp"
#include "data/indexed_dataset.hpp"
#include "data/token_shard.hpp"

namespace fs = std::filesystem;
using trident::Error;
using trident::IndexedDatasetReader;
using trident::IndexedDatasetWriter;
using trident::IndexedDtype;

namespace {

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("trident_indexed_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(IndexedDatasetTest, RoundTripEveryIntegerDtype) {
  const std::pair<IndexedDtype, std::int32_t> types[] = {
      {IndexedDtype::uint8, 255},    {IndexedDtype::int8, 127},         {IndexedDtype::int16, 32767},
      {IndexedDtype::uint16, 65535}, {IndexedDtype::int32, 2000000000}, {IndexedDtype::int64, 2000000000}};
  for (const auto& [dt, top] : types) {
    const std::string p = path("d" + std::to_string(static_cast<int>(dt)));
    std::mt19937 rng(static_cast<unsigned>(dt));
    std::vector<std::vector<std::int32_t>> docs(50);
    {
      IndexedDatasetWriter w(p, dt);
      for (std::size_t d = 0; d < docs.size(); ++d) {
        docs[d].resize(d % 7 == 3 ? 0 : rng() % 40 + 1);
        for (auto& t : docs[d]) t = static_cast<std::int32_t>(rng() % (static_cast<std::uint32_t>(top) + 1));
        if (!docs[d].empty()) docs[d][0] = top;
        w.add_document(docs[d]);
      }
      w.close();
    }
    IndexedDatasetReader r(p);
    EXPECT_EQ(r.dtype_code(), static_cast<int>(dt));
    EXPECT_EQ(r.num_documents(), 50);
    std::int64_t at = 0;
    for (std::size_t d = 0; d < docs.size(); ++d) {
      const std::int64_t b = r.sequence_start(r.document_index(static_cast<std::int64_t>(d)));
      const std::int64_t e = r.sequence_start(r.document_index(static_cast<std::int64_t>(d) + 1));
      ASSERT_EQ(b, at);
      ASSERT_EQ(e - b, static_cast<std::int64_t>(docs[d].size()));
      std::vector<std::int32_t> got(docs[d].size());
      r.read(b, e - b, got.data());
      EXPECT_EQ(got, docs[d]) << "dtype " << static_cast<int>(dt) << " document " << d;
      at = e;
    }
    EXPECT_EQ(at, r.num_tokens());
  }
}

TEST_F(IndexedDatasetTest, WriterRefusesValuesOutsideItsDtypeAndLeavesNothing) {
  {
    IndexedDatasetWriter w(path("x"), IndexedDtype::uint16);
    EXPECT_THROW(w.add_document({1, 65536}), Error);
    EXPECT_THROW(w.add_document({1, 2, 3}, {2, 2}), Error);  // sequence ends must increase
    EXPECT_THROW(w.add_document({1, 2, 3}, {1, 2}), Error);  // the last must close the document
  }                                                          // abandoned
  EXPECT_FALSE(fs::exists(path("x.bin")));
  EXPECT_FALSE(fs::exists(path("x.bin.tmp")));
  EXPECT_FALSE(fs::exists(path("x.idx")));
}

TEST_F(IndexedDatasetTest, PrefixDetectionAndMegatronDtypeRule) {
  IndexedDatasetWriter w(path("p"), IndexedDtype::uint16);
  w.add_document({1, 2});
  w.close();
  EXPECT_EQ(trident::indexed_dataset_prefix(path("p")), path("p"));
  EXPECT_EQ(trident::indexed_dataset_prefix(path("p.bin")), path("p"));
  EXPECT_EQ(trident::indexed_dataset_prefix(path("p.idx")), path("p"));
  EXPECT_EQ(trident::indexed_dataset_prefix(path("q")), "");
  EXPECT_EQ(trident::megatron_optimal_dtype(50257), IndexedDtype::uint16);
  EXPECT_EQ(trident::megatron_optimal_dtype(65499), IndexedDtype::uint16);
  EXPECT_EQ(trident::megatron_optimal_dtype(65500), IndexedDtype::int32);
}

TEST_F(IndexedDatasetTest, TokenShardReaderOverAPairWithSentences) {
  {
    IndexedDatasetWriter w(path("c_text_sentence"), IndexedDtype::uint16);
    w.add_document({1, 2, 3, 4, 5}, {2, 5});  // two sentences
    w.add_document({});                       // empty
    w.add_document({6, 7, 8});                // one sentence
    w.close();
  }
  trident::TokenShardMeta tok;
  tok.tokenizer = "GPT2BPETokenizer";
  tok.vocab_size = 100;
  tok.eod_id = 8;
  EXPECT_THROW(trident::TokenShardReader(path("c_text_sentence")), Error);  // no tokenizer given
  trident::TokenShardReader r(path("c_text_sentence.idx"), &tok);
  EXPECT_EQ(r.meta().format, std::string(trident::kIndexedFormat));
  EXPECT_EQ(r.meta().vocab_size, 100);
  EXPECT_EQ(r.meta().eod_id, 8);
  EXPECT_EQ(r.document_offsets().to_vector(), (std::vector<std::int64_t>{0, 5, 5, 8}));
  EXPECT_TRUE(r.meta().has_sentences);
  EXPECT_EQ(r.sentence_offsets().to_vector(), (std::vector<std::int64_t>{0, 2, 5, 8}));
  std::vector<std::int32_t> t(3);
  r.read(5, 3, t.data());
  EXPECT_EQ(t, (std::vector<std::int32_t>{6, 7, 8}));
  tok.vocab_size = 8;  // token 8 is now outside the vocabulary
  trident::TokenShardReader small(path("c_text_sentence"), &tok);
  EXPECT_THROW(small.read(5, 3, t.data()), Error);
  EXPECT_EQ(small.changed_on_disk(), "");
}

}  // namespace
