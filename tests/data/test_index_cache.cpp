// The dataset index cache (data/index_cache.*) and the SIGBUS guard of mapped reads
// (io/mapped_file.hpp): built once then loaded, a changed key or a damaged file rebuilt, an
// unwritable directory kept in memory, concurrent builders (processes) building once and
// leaving no temporary file, the GPT dataset's samples the same with and without the cache,
// and a mapped file that shrinks becoming an error instead of a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.hpp"
#include "data/corpus.hpp"
#include "data/gpt_dataset.hpp"
#include "data/index_cache.hpp"
#include "data/token_shard.hpp"
#include "io/mapped_file.hpp"

namespace fs = std::filesystem;
using trident::cached_index;
using trident::CachedIndex;
using trident::Error;

namespace {

class IndexCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("trident_cache_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<std::vector<std::int64_t>> arrays() { return {{1, 2, 3}, {}, {-5, 1LL << 40}}; }

void expect_arrays(const CachedIndex& c) {
  const auto want = arrays();
  ASSERT_EQ(c.count(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(c.size(k), static_cast<std::int64_t>(want[k].size()));
    for (std::size_t i = 0; i < want[k].size(); ++i) EXPECT_EQ(c.data(k)[i], want[k][i]);
  }
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(IndexCacheTest, BuiltOnceThenLoaded) {
  int builds = 0;
  auto build = [&] {
    ++builds;
    return arrays();
  };
  const CachedIndex a = cached_index(path("c"), "t", "key one", build);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(a.origin().rfind("built, cached in ", 0), 0u) << a.origin();
  expect_arrays(a);
  const CachedIndex b = cached_index(path("c"), "t", "key one", build);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(b.origin().rfind("loaded from ", 0), 0u) << b.origin();
  expect_arrays(b);
  const CachedIndex m = cached_index("", "t", "key one", build);  // in memory
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(m.origin(), "built in memory");
  expect_arrays(m);
}

TEST_F(IndexCacheTest, DamagedOrForeignFilesAreRebuilt) {
  int builds = 0;
  auto build = [&] {
    ++builds;
    return arrays();
  };
  const std::string file = cached_index(path("c"), "t", "the key", build).file();
  ASSERT_FALSE(file.empty());
  // another key stored under this name (as a hash collision would): rebuilt, not used
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(32);
    f.write("X", 1);
  }
  EXPECT_EQ(cached_index(path("c"), "t", "the key", build).origin().rfind("built", 0), 0u);
  EXPECT_EQ(builds, 2);
  // truncated: rebuilt
  fs::resize_file(file, fs::file_size(file) - 8);
  const CachedIndex c = cached_index(path("c"), "t", "the key", build);
  EXPECT_EQ(builds, 3);
  expect_arrays(c);
  EXPECT_EQ(cached_index(path("c"), "t", "the key", build).origin().rfind("loaded", 0), 0u);
  EXPECT_EQ(builds, 3);
}

TEST_F(IndexCacheTest, UnwritableDirectoryKeepsTheIndexInMemory) {
  std::ofstream(path("file")) << "x";
  const CachedIndex c = cached_index(path("file") + "/sub", "t", "k", arrays);
  EXPECT_EQ(c.origin().rfind("built in memory (cannot create the cache directory", 0), 0u) << c.origin();
  EXPECT_TRUE(c.file().empty());
  expect_arrays(c);
}

TEST_F(IndexCacheTest, ConcurrentProcessesBuildOnce) {
  const std::string builds = path("builds.txt");
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        const CachedIndex c = cached_index(path("c"), "t", "shared key", [&] {
          std::ofstream(builds, std::ios::app) << "x";
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          return arrays();
        });
        const auto want = arrays();
        if (c.count() != 3 || c.size(0) != 3 || c.data(2)[1] != want[2][1]) rc = 2;
      } catch (...) {
        rc = 3;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit " << status;
  }
  std::ifstream in(builds);
  std::string marks((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(marks, "x") << "the index was built " << marks.size() << " times";
  const auto left = files_in(path("c"));
  ASSERT_EQ(left.size(), 2u);  // the file and its lock; no temporary file
  EXPECT_EQ(left[1], left[0] + ".lock");
}

TEST_F(IndexCacheTest, GptDatasetSamplesEqualWithAndWithoutCache) {
  {
    trident::TokenShardWriter w(path("s.h5"), "GPT2BPETokenizer", 1000, 999, false);
    for (int d = 0; d < 60; ++d) {
      std::vector<std::int32_t> t(static_cast<std::size_t>(5 + d % 17));
      for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>((d * 31 + i * 7) % 999);
      t.push_back(999);
      w.add_document(t);
    }
    w.close();
  }
  trident::Corpus c({path("s.h5")});
  trident::GptDataset mem(c, 0, 50, 16, 200, 7, "x/train", true, "");
  trident::GptDataset built(c, 0, 50, 16, 200, 7, "x/train", true, path("c"));
  trident::GptDataset loaded(c, 0, 50, 16, 200, 7, "x/train", true, path("c"));
  EXPECT_EQ(mem.index_origin(), "built in memory");
  EXPECT_EQ(built.index_origin().rfind("built, cached", 0), 0u);
  EXPECT_EQ(loaded.index_origin().rfind("loaded", 0), 0u);
  ASSERT_EQ(mem.size(), loaded.size());
  EXPECT_EQ(mem.epochs(), loaded.epochs());
  std::vector<std::int32_t> a(17), b(17);
  for (std::int64_t i = 0; i < mem.size(); ++i) {
    mem.get(i, a.data());
    loaded.get(i, b.data());
    ASSERT_EQ(a, b) << "sample " << i;
  }
  // another seed or sample count is another key: built afresh
  trident::GptDataset other(c, 0, 50, 16, 200, 8, "x/train", true, path("c"));
  EXPECT_EQ(other.index_origin().rfind("built, cached", 0), 0u);
  // the shard rewritten (a new modification time): the key changes, the index is rebuilt
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fs::last_write_time(path("s.h5"), fs::file_time_type::clock::now());
  trident::Corpus c2({path("s.h5")});
  trident::GptDataset again(c2, 0, 50, 16, 200, 7, "x/train", true, path("c"));
  EXPECT_EQ(again.index_origin().rfind("built, cached", 0), 0u) << again.index_origin();
}

TEST_F(IndexCacheTest, GuardTurnsSigbusIntoError) {
  {
    std::ofstream f(path("m.bin"), std::ios::binary);
    std::vector<char> z(1 << 16, 1);
    f.write(z.data(), static_cast<std::streamsize>(z.size()));
  }
  trident::MappedFile m(path("m.bin"));
  const volatile unsigned char* p = m.data();  // volatile: the reads below are not optimised away
  EXPECT_EQ(trident::guarded_map_read("probe", [&] { return int(p[40000]); }), 1);
  fs::resize_file(path("m.bin"), 4096);  // the pages past 4096 are gone
  try {
    trident::guarded_map_read("probe", [&] { return int(p[40000]); });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("probe changed while the job reads it"), std::string::npos) << e.what();
  }
  // the guard is released: a later guarded read of a good page works
  EXPECT_EQ(trident::guarded_map_read("probe", [&] { return int(p[100]); }), 1);
}

}  // namespace
