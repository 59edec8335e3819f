// TokenShardWriter / TokenShardReader: round trips (uint16 and int32 token types, sentence
// offsets, documents larger than the writer's buffer), the temporary-name protocol, and
// malformed files, each of which must raise trident::Error naming the file and the problem.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "common/error.hpp"
#include "data/token_shard.hpp"
#include "io/hdf5_handle.hpp"

namespace fs = std::filesystem;
using trident::Error;
using trident::H5Handle;
using trident::TokenShardReader;
using trident::TokenShardWriter;

namespace {

class TokenShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("trident_shard_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<std::vector<std::int32_t>> random_docs(int n, std::int32_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::int32_t>> docs(n);
  for (auto& d : docs) {
    d.resize(rng() % 200);  // some empty
    for (auto& t : d) t = static_cast<std::int32_t>(rng() % vocab);
  }
  return docs;
}

// Type of /tokens in the file: (size in bytes, signed).
std::pair<std::size_t, bool> token_type(const std::string& p) {
  H5Handle f = trident::h5_file(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5Handle d = trident::h5_dataset(H5Dopen2(f, "tokens", H5P_DEFAULT));
  H5Handle t = trident::h5_type(H5Dget_type(d));
  return {H5Tget_size(t), H5Tget_sign(t) == H5T_SGN_2};
}

// Writes a small valid shard and then applies `mutate` to the open file.
void write_and_mutate(const std::string& p, const std::function<void(hid_t)>& mutate) {
  {
    TokenShardWriter w(p, "GPT2BPETokenizer", 100, 99, true);
    w.add_document({1, 2, 3}, {2, 3});
    w.add_document({4, 5});
    w.close();
  }
  H5Handle f = trident::h5_file(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_TRUE(f.valid());
  mutate(f);
}

void replace_int64(hid_t f, const char* name, const std::vector<std::int64_t>& v) {
  H5Ldelete(f, name, H5P_DEFAULT);
  const hsize_t dims[1] = {v.size()};
  H5Handle s = trident::h5_space(H5Screate_simple(1, dims, nullptr));
  H5Handle d = trident::h5_dataset(H5Dcreate2(f, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
}

// Expects opening `p` to throw an Error whose message names the file and contains `what`.
void expect_open_error(const std::string& p, const std::string& what) {
  try {
    TokenShardReader r(p);
    ADD_FAILURE() << "opening " << p << " did not throw (expected: " << what << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "message lacks '" << what << "': " << msg;
  }
}

}  // namespace

TEST_F(TokenShardTest, RoundTripUint16) {
  const auto docs = random_docs(50, 50257, 1);
  const std::string p = path("a.h5");
  std::vector<std::int32_t> all;
  std::vector<std::int64_t> offsets{0};
  {
    TokenShardWriter w(p, "GPT2BPETokenizer", 50257, 50256, false);
    for (const auto& d : docs) {
      w.add_document(d);
      all.insert(all.end(), d.begin(), d.end());
      offsets.push_back(static_cast<std::int64_t>(all.size()));
    }
    EXPECT_EQ(w.num_documents(), 50);
    EXPECT_EQ(w.num_tokens(), static_cast<std::int64_t>(all.size()));
    EXPECT_TRUE(fs::exists(p + ".tmp"));
    EXPECT_FALSE(fs::exists(p)) << "the final name must appear only at close()";
    w.close();
  }
  EXPECT_TRUE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(token_type(p), std::make_pair(std::size_t(2), false));

  TokenShardReader r(p);
  EXPECT_EQ(r.meta().tokenizer, "GPT2BPETokenizer");
  EXPECT_EQ(r.meta().format_version, trident::kTokenShardVersion);
  EXPECT_EQ(r.meta().max_token_id, *std::max_element(all.begin(), all.end()));
  EXPECT_EQ(r.meta().vocab_size, 50257);
  EXPECT_EQ(r.meta().eod_id, 50256);
  EXPECT_EQ(r.meta().num_tokens, static_cast<std::int64_t>(all.size()));
  EXPECT_EQ(r.meta().num_documents, 50);
  EXPECT_FALSE(r.meta().has_sentences);
  EXPECT_TRUE(r.sentence_offsets().empty());
  EXPECT_EQ(r.document_offsets().to_vector(), offsets);
  std::vector<std::int32_t> got(all.size());
  r.read(0, static_cast<std::int64_t>(all.size()), got.data());
  EXPECT_EQ(got, all);
  // A range in the middle.
  std::vector<std::int32_t> part(100);
  r.read(37, 100, part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 37));
  r.read(5, 0, nullptr);  // empty range is fine
  EXPECT_THROW(r.read(static_cast<std::int64_t>(all.size()) - 3, 4, part.data()), Error);
  EXPECT_THROW(r.read(-1, 2, part.data()), Error);

  // Move keeps the handles usable.
  TokenShardReader moved(std::move(r));
  moved.read(37, 100, part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 37));
}

TEST_F(TokenShardTest, Int32WhenVocabularyExceeds16Bits) {
  const std::string p = path("wide.h5");
  const std::vector<std::int32_t> doc{0, 65535, 65536, 99999, 7};
  {
    TokenShardWriter w(p, "Big", 100000, -1, false);
    w.add_document(doc);
    w.close();
  }
  EXPECT_EQ(token_type(p), std::make_pair(std::size_t(4), true));
  TokenShardReader r(p);
  EXPECT_EQ(r.meta().eod_id, -1);
  std::vector<std::int32_t> got(doc.size());
  r.read(0, 5, got.data());
  EXPECT_EQ(got, doc);
  // 65536 entries still fit uint16 (ids 0..65535).
  const std::string q = path("edge.h5");
  {
    TokenShardWriter w(q, "Edge", 65536, 65535, false);
    w.add_document({65535, 0});
    w.close();
  }
  EXPECT_EQ(token_type(q), std::make_pair(std::size_t(2), false));
  TokenShardReader rq(q);
  rq.read(0, 2, got.data());
  EXPECT_EQ(got[0], 65535);
}

TEST_F(TokenShardTest, LargeDocumentAcrossBufferFlushes) {
  // Larger than the writer's 1 Mi-token buffer and several chunks.
  const std::string p = path("big.h5");
  std::vector<std::int32_t> doc(1300000);
  for (std::size_t k = 0; k < doc.size(); ++k) doc[k] = static_cast<std::int32_t>((k * 7919) % 50257);
  {
    TokenShardWriter w(p, "GPT2BPETokenizer", 50257, 50256, false);
    w.add_document({1, 2, 3});
    w.add_document(doc);
    w.add_document({4});
    w.close();
  }
  TokenShardReader r(p);
  EXPECT_EQ(r.meta().num_tokens, 1300004);
  EXPECT_EQ(r.document_offsets().to_vector(), (std::vector<std::int64_t>{0, 3, 1300003, 1300004}));
  std::vector<std::int32_t> got(doc.size());
  r.read(3, static_cast<std::int64_t>(doc.size()), got.data());
  EXPECT_EQ(got, doc);
}

TEST_F(TokenShardTest, SentenceOffsetsAreAbsoluteAndIncludeDocumentBoundaries) {
  const std::string p = path("s.h5");
  {
    TokenShardWriter w(p, "GPT2BPETokenizer", 50257, 50256, true);
    w.add_document({1, 2, 3, 4, 5}, {2, 5});
    w.add_document({6, 7, 8});  // no ends given: one sentence
    w.add_document({}, {});     // empty document: adds no sentence
    w.add_document({9, 10}, {1, 2});
    w.close();
  }
  TokenShardReader r(p);
  EXPECT_TRUE(r.meta().has_sentences);
  EXPECT_EQ(r.document_offsets().to_vector(), (std::vector<std::int64_t>{0, 5, 8, 8, 10}));
  EXPECT_EQ(r.sentence_offsets().to_vector(), (std::vector<std::int64_t>{0, 2, 5, 8, 9, 10}));
}

TEST_F(TokenShardTest, WriterRejectsBadInput) {
  TokenShardWriter w(path("bad.h5"), "T", 10, 9, true);
  EXPECT_THROW(w.add_document({1, 10}), Error);               // id >= vocab_size
  EXPECT_THROW(w.add_document({-1}), Error);                  // negative id
  EXPECT_THROW(w.add_document({1, 2, 3}, {2}), Error);        // last end != length
  EXPECT_THROW(w.add_document({1, 2, 3}, {2, 2, 3}), Error);  // not increasing
  EXPECT_THROW(w.add_document({1, 2, 3}, {0, 3}), Error);     // empty sentence
  TokenShardWriter plain(path("plain.h5"), "T", 10, 9, false);
  EXPECT_THROW(plain.add_document({1, 2}, {2}), Error);  // sentences without with_sentences
  EXPECT_THROW(TokenShardWriter(path("v.h5"), "T", 0, -1, false), Error);
  EXPECT_THROW(TokenShardWriter(path("e.h5"), "T", 10, 10, false), Error);
  try {
    TokenShardWriter nodir(path("no/such/dir/x.h5"), "T", 10, 9, false);
    ADD_FAILURE() << "creating a shard in a missing directory did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.h5"), std::string::npos) << e.what();
  }
}

TEST_F(TokenShardTest, AbandonedWriterLeavesNoFile) {
  const std::string p = path("abandoned.h5");
  {
    TokenShardWriter w(p, "T", 10, 9, false);
    w.add_document({1, 2, 3});
    EXPECT_TRUE(fs::exists(p + ".tmp"));
  }  // no close()
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(TokenShardTest, EmptyShardIsValid) {
  const std::string p = path("empty.h5");
  {
    TokenShardWriter w(p, "T", 10, 9, true);
    w.close();
    w.close();  // idempotent
  }
  TokenShardReader r(p);
  EXPECT_EQ(r.meta().num_tokens, 0);
  EXPECT_EQ(r.meta().num_documents, 0);
  EXPECT_EQ(r.document_offsets().to_vector(), std::vector<std::int64_t>{0});
  EXPECT_EQ(r.sentence_offsets().to_vector(), std::vector<std::int64_t>{0});
}

TEST_F(TokenShardTest, MissingOrNonHdf5File) {
  expect_open_error(path("nope.h5"), "does not exist");
  const std::string txt = path("text.h5");
  std::ofstream(txt) << "this is not HDF5\n";
  expect_open_error(txt, "cannot be opened as an HDF5 file");
  expect_open_error(dir_.string(), "not a regular file");
}

TEST_F(TokenShardTest, MalformedFilesNameTheProblem) {
  struct Case {
    const char* name;
    std::function<void(hid_t)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"no_tokens.h5", [](hid_t f) { H5Ldelete(f, "tokens", H5P_DEFAULT); }, "missing dataset /tokens"},
      {"no_offsets.h5", [](hid_t f) { H5Ldelete(f, "document_offsets", H5P_DEFAULT); },
       "missing dataset /document_offsets"},
      {"no_format.h5", [](hid_t f) { H5Adelete(f, "format"); }, "missing attribute 'format'"},
      {"bad_format.h5", [](hid_t f) { trident::h5_write_attr(f, "format", std::string("trident.checkpoint")); },
       "attribute 'format' is 'trident.checkpoint'"},
      {"format_int.h5", [](hid_t f) { trident::h5_write_attr(f, "format", std::int64_t(1)); },
       "attribute 'format' is not a string"},
      {"version.h5", [](hid_t f) { trident::h5_write_attr(f, "format_version", std::int64_t(4)); },
       "format_version 4 is not supported"},
      {"no_digest.h5", [](hid_t f) { H5Adelete(f, "tokenizer_digest"); }, "missing attribute 'tokenizer_digest'"},
      {"no_max.h5", [](hid_t f) { H5Adelete(f, "max_token_id"); }, "missing attribute 'max_token_id'"},
      {"max.h5", [](hid_t f) { trident::h5_write_attr(f, "max_token_id", std::int64_t(100)); },
       "holds token id 100, outside its vocabulary (vocab_size 100)"},
      {"v1_scan.h5",
       [](hid_t f) {  // version 1 records no maximum: the tokens are scanned when the shard opens
         trident::h5_write_attr(f, "format_version", std::int64_t(1));
         H5Adelete(f, "max_token_id");
         H5Handle d = trident::h5_dataset(H5Dopen2(f, "tokens", H5P_DEFAULT));
         const std::int32_t big[5] = {1, 2, 150, 4, 5};
         H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, big);
       },
       "holds token id 150, outside its vocabulary (vocab_size 100)"},
      {"no_version.h5", [](hid_t f) { H5Adelete(f, "format_version"); }, "missing attribute 'format_version'"},
      {"no_tokenizer.h5", [](hid_t f) { H5Adelete(f, "tokenizer"); }, "missing attribute 'tokenizer'"},
      {"vocab0.h5", [](hid_t f) { trident::h5_write_attr(f, "vocab_size", std::int64_t(0)); },
       "'vocab_size' must be positive"},
      {"eod.h5", [](hid_t f) { trident::h5_write_attr(f, "eod_id", std::int64_t(100)); }, "'eod_id' 100 outside"},
      {"start.h5",
       [](hid_t f) {
         replace_int64(f, "document_offsets", {1, 3, 5});
       },
       "/document_offsets must start at 0"},
      {"decrease.h5",
       [](hid_t f) {
         replace_int64(f, "document_offsets", {0, 4, 3, 5});
       },
       "/document_offsets decreases at entry 2"},
      {"end.h5",
       [](hid_t f) {
         replace_int64(f, "document_offsets", {0, 3, 6});
       },
       "/document_offsets ends at 6 but /tokens holds 5 tokens"},
      {"empty_offsets.h5", [](hid_t f) { replace_int64(f, "document_offsets", {}); }, "/document_offsets is empty"},
      {"sent_end.h5",
       [](hid_t f) {
         replace_int64(f, "sentence_offsets", {0, 2, 3, 4});
       },
       "/sentence_offsets ends at 4"},
      {"sent_repeat.h5",
       [](hid_t f) {
         replace_int64(f, "sentence_offsets", {0, 2, 3, 3, 5});
       },
       "/sentence_offsets repeats offset 3 at entry 3 (an empty sentence"},
      {"sent_doc.h5",
       [](hid_t f) {
         replace_int64(f, "sentence_offsets", {0, 2, 5});
       },
       "document boundary 3 (document 1) is missing from /sentence_offsets"},
      {"float_tokens.h5",
       [](hid_t f) {
         H5Ldelete(f, "tokens", H5P_DEFAULT);
         const hsize_t dims[1] = {5};
         H5Handle s = trident::h5_space(H5Screate_simple(1, dims, nullptr));
         H5Handle d = trident::h5_dataset(
             H5Dcreate2(f, "tokens", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
       },
       "/tokens is not of an integer type"},
      {"int64_tokens.h5",
       [](hid_t f) {
         H5Ldelete(f, "tokens", H5P_DEFAULT);
         const hsize_t dims[1] = {5};
         H5Handle s = trident::h5_space(H5Screate_simple(1, dims, nullptr));
         H5Handle d = trident::h5_dataset(
             H5Dcreate2(f, "tokens", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
       },
       "/tokens has an integer type of 8 bytes"},
      {"tokens_2d.h5",
       [](hid_t f) {
         H5Ldelete(f, "tokens", H5P_DEFAULT);
         const hsize_t dims[2] = {5, 1};
         H5Handle s = trident::h5_space(H5Screate_simple(2, dims, nullptr));
         H5Handle d = trident::h5_dataset(
             H5Dcreate2(f, "tokens", H5T_STD_U16LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
       },
       "/tokens must be 1-D"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = path(c.name);
    write_and_mutate(p, c.mutate);
    expect_open_error(p, c.expect);
  }
}

// A token id the attributes do not admit is found when it is read; a chunk whose bytes changed
// fails its Fletcher-32 checksum; a file truncated or replaced under an open reader is reported.
TEST_F(TokenShardTest, CorruptOrChangedFilesAreDetected) {
  {  // max_token_id lies: the read names the token and its position
    const std::string p = path("lie.h5");
    write_and_mutate(p, [](hid_t f) {
      H5Handle d = trident::h5_dataset(H5Dopen2(f, "tokens", H5P_DEFAULT));
      const std::int32_t big[5] = {1, 2, 150, 4, 5};
      H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, big);
    });
    TokenShardReader r(p);
    std::vector<std::int32_t> out(5);
    try {
      r.read(0, 5, out.data());
      ADD_FAILURE() << "a token outside the vocabulary was read without an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token id 150 at position 2 is outside the vocabulary"), std::string::npos)
          << e.what();
    }
  }
  // three chunks of tokens; bytes in the middle one overwritten by zeros
  const std::string p = path("rot.h5");
  std::vector<std::int32_t> doc(3 * trident::kTokenShardChunk);
  for (std::size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<std::int32_t>(1 + i % 50000);
  {
    TokenShardWriter w(p, "GPT2BPETokenizer", 50257, 50256, false);
    w.add_document(doc);
    w.close();
  }
  haddr_t chunk_addr = 0;
  {
    H5Handle f = trident::h5_file(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Handle d = trident::h5_dataset(H5Dopen2(f, "tokens", H5P_DEFAULT));
    hsize_t offset[1];
    unsigned mask = 0;
    hsize_t size = 0;
    H5Handle space = trident::h5_space(H5Dget_space(d));
    ASSERT_GE(H5Dget_chunk_info(d, space, 1, offset, &mask, &chunk_addr, &size), 0);
    ASSERT_EQ(offset[0], static_cast<hsize_t>(trident::kTokenShardChunk));
  }
  {
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(chunk_addr + 1000));
    const std::vector<char> zeros(4096, 0);
    io.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  TokenShardReader r(p);
  std::vector<std::int32_t> out(100);
  r.read(10, 100, out.data());  // the first chunk is intact
  EXPECT_TRUE(std::equal(out.begin(), out.end(), doc.begin() + 10));
  try {
    r.read(trident::kTokenShardChunk + 5000, 100, out.data());
    ADD_FAILURE() << "a chunk with overwritten bytes was read without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fails its checksum"), std::string::npos) << e.what();
  }
  // truncated under the open reader: reported by changed_on_disk and by check_touched_shards
  EXPECT_EQ(r.changed_on_disk(), "");
  (void)TokenShardReader::check_touched_shards();  // clears the marks of the reads above
  EXPECT_EQ(TokenShardReader::check_touched_shards(), "") << "no read since the last check";
  fs::resize_file(p, 4096);
  EXPECT_NE(r.changed_on_disk().find("its size changed from"), std::string::npos) << r.changed_on_disk();
  EXPECT_EQ(TokenShardReader::check_touched_shards(), "") << "the shard was not read since the last check";
  try {
    r.read(10, 100, out.data());  // cached chunk: HDF5 may serve it from memory
  } catch (const Error&) {
  }
  const std::string report = TokenShardReader::check_touched_shards();
  EXPECT_NE(report.find(p), std::string::npos) << report;
  EXPECT_NE(report.find("changed while the job reads it: its size changed from"), std::string::npos) << report;
  // replaced by another file
  const std::string q = path("swap.h5");
  write_and_mutate(q, [](hid_t) {});
  TokenShardReader rq(q);
  fs::copy_file(path("lie.h5"), q + ".new");
  fs::rename(q + ".new", q);
  EXPECT_EQ(rq.changed_on_disk(), "it was replaced by another file");
}
