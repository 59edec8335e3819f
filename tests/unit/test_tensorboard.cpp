// TensorBoard event files (io/tensorboard.*, io/protobuf_wire.*): CRC32C against published check
// values, the protobuf wire format against the encoding examples of its documentation, TFRecord
// framing, the histogram's buckets, and the writer: a new file per writer, every record framed
// and checksummed, and a write failure (a file-size limit standing in for a full disk) reported
// without blocking the caller. The independent reader of whole runs is tests/e2e/tensorboard_checks.py.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/protobuf_wire.hpp"
#include "io/tensorboard.hpp"

using namespace trident;
namespace fs = std::filesystem;

namespace {

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::uint64_t le(const std::string& s, size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// The records of an event file; fails the test on a bad checksum or a truncated record.
std::vector<std::string> records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < f.size()) {
    EXPECT_LE(at + 12, f.size());
    if (at + 12 > f.size()) break;
    const std::uint64_t n = le(f, at, 8);
    EXPECT_EQ(le(f, at + 8, 4), masked_crc32c(f.substr(at, 8)));
    EXPECT_LE(at + 16 + n, f.size());
    if (at + 16 + n > f.size()) break;
    const std::string data = f.substr(at + 12, n);
    EXPECT_EQ(le(f, at + 12 + n, 4), masked_crc32c(data));
    out.push_back(data);
    at += 16 + n;
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("trident_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);              // the CRC catalogue's check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);    // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // 32 bytes of ones
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(inc), 0x46DD794Eu);                      // incrementing bytes
  EXPECT_EQ(crc32c("56789", crc32c("1234")), 0xE3069283u);  // continued over pieces
}

TEST(ProtobufWire, DocumentationExamples) {
  EXPECT_EQ(hex(pb::Message().varint(1, 150).data()), "089601");
  EXPECT_EQ(hex(pb::Message().bytes(2, "testing").data()), "120774657374696e67");
  pb::Message inner;
  inner.varint(1, 150);
  EXPECT_EQ(hex(pb::Message().message(3, inner).data()), "1a03089601");
  EXPECT_EQ(hex(pb::Message().f32(2, 1.0f).data()), "150000803f");
  EXPECT_EQ(hex(pb::Message().f64(1, 1.0).data()), "09000000000000f03f");
  EXPECT_EQ(hex(pb::Message().int64(2, -1).data()), "10ffffffffffffffffff01");  // ten bytes
  EXPECT_EQ(hex(pb::Message().packed_f64(6, {1.0, -2.0}).data()), "3210000000000000f03f00000000000000c0");
  EXPECT_EQ(pb::Message().packed_f64(6, {}).data(), "");
}

TEST(TfRecord, Framing) {
  const std::string r = tfrecord("abc");
  ASSERT_EQ(r.size(), 3u + 16u);
  EXPECT_EQ(le(r, 0, 8), 3u);
  EXPECT_EQ(le(r, 8, 4), masked_crc32c(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(le(r, 15, 4), masked_crc32c("abc"));
  const std::uint32_t c = crc32c("abc");
  EXPECT_EQ(masked_crc32c("abc"), static_cast<std::uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

TEST(TbSummary, HistogramBuckets) {
  // min(30, n) equal buckets between min and max; a value on a limit counts in the lower bucket
  TbSummary s;
  s.histogram("h", {4.0, 1.0, 2.5, 3.0});
  const std::string& m = s.message().data();
  // Summary.value (field 1) > Value: tag "h", histo (field 5)
  pb::Message h;
  h.f64(1, 1.0).f64(2, 4.0).f64(3, 4.0).f64(4, 10.5).f64(5, 16.0 + 1.0 + 6.25 + 9.0);
  h.packed_f64(6, {1.75, 2.5, 3.25, 4.0}).packed_f64(7, {1, 1, 1, 1});  // 2.5 on the second limit
  pb::Message v;
  v.bytes(1, "h").message(5, h);
  EXPECT_EQ(hex(m), hex(pb::Message().message(1, v).data()));
  // all equal: one bucket per value, all counted in the first
  TbSummary e;
  e.histogram("e", {2.0, 2.0});
  pb::Message he;
  he.f64(1, 2.0).f64(2, 2.0).f64(3, 2.0).f64(4, 4.0).f64(5, 8.0).packed_f64(6, {2.0, 2.0}).packed_f64(7, {2, 0});
  pb::Message ve;
  ve.bytes(1, "e").message(5, he);
  EXPECT_EQ(hex(e.message().data()), hex(pb::Message().message(1, ve).data()));
  // more than 30 values: 30 buckets
  std::vector<double> many;
  for (int i = 0; i < 100; ++i) many.push_back(i);
  TbSummary big;
  big.histogram("b", many);
  EXPECT_NE(big.message().data().find(pb::Message().packed_f64(7, std::vector<double>(30, 0.0)).data().substr(0, 2)),
            std::string::npos);  // a packed field of 30 doubles: key 0x3a, length 240 (0xf0 0x01)
}

TEST(TensorBoardWriter, NewFilePerRunEveryRecordFramed) {
  const fs::path d = fresh_dir("files");
  std::string first;
  {
    TensorBoardWriter w(d.string(), 1, "[train]\niters = 3\n");
    first = w.path();
    for (int it = 1; it <= 3; ++it) {
      TbSummary s;
      s.scalar("train/loss", 1.0 / it);
      w.write(it, s);
    }
  }
  const auto recs = records(first);
  ASSERT_EQ(recs.size(), 3u + 3u);  // version, session start, deck, three iterations
  EXPECT_NE(recs[0].find("brain.Event:2"), std::string::npos);
  // Event.session_log (field 7, length-delimited: key 0x3a) holding SessionLog.status START (1)
  EXPECT_NE(recs[1].find(std::string("\x3a\x02\x08\x01", 4)), std::string::npos) << hex(recs[1]);
  EXPECT_NE(recs[2].find("    [train]\n    iters = 3\n"), std::string::npos);
  std::ifstream a(first, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  std::string second;
  {
    TensorBoardWriter w(d.string(), 4, "");  // a resumed run: a new file, the old one untouched
    second = w.path();
    TbSummary s;
    s.scalar("train/loss", 0.25);
    w.write(4, s);
  }
  EXPECT_NE(first, second);
  std::ifstream b(first, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>()), before);
  EXPECT_EQ(records(second).size(), 3u);  // version, session start, one iteration
  fs::remove_all(d);
}

TEST(TensorBoardWriter, WriteFailureIsReportedNotWaitedOn) {
  const fs::path d = fresh_dir("full");
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;  // files stop growing at 4 KiB: writes fail with EFBIG, as on a full disk
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string path;
  testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  {
    TensorBoardWriter w(d.string(), 1, "");
    path = w.path();
    for (int it = 1; it <= 2000; ++it) {
      TbSummary s;
      s.scalar("train/loss", it).scalar("train/lr", 1e-3);
      w.write(it, s);
    }
    w.close(10.0);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = testing::internal::GetCapturedStderr();
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(err.find("warning: log.tensorboard_dir: writing '" + path + "' failed"), std::string::npos) << err;
  EXPECT_NE(err.find("not written after a write failed"), std::string::npos) << err;
  EXPECT_LE(fs::file_size(path), 4096u);
  fs::remove_all(d);
}
