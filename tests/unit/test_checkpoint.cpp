// Checkpoint round trip (one rank): parameters and optimizer state come back bit for bit,
// 'latest' and the atomic rename, and shape/kind mismatches are errors naming the tensor.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/tensor_runs.hpp"
#include "models/gpt_model.hpp"
#include "test_helpers.hpp"

using namespace trident;
using namespace trident::test;
namespace fs = std::filesystem;

namespace {
TransformerConfig cfg(std::int64_t layers) {
  TransformerConfig c;
  c.num_layers = layers;
  c.hidden_size = 8;
  c.num_heads = 2;
  c.ffn_hidden_size = 16;
  c.seq_length = 4;
  c.max_positions = 4;
  c.vocab_size = 10;
  c.padded_vocab = 16;
  return c;
}
std::string tmpdir(const char* name) {
  auto d = fs::temp_directory_path() / ("trident_test_" + std::string(name) + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}
// The stored part of every parameter of `a` (padded embedding rows are not stored) equals b's.
void expect_same_stored_values(const ParamStore& a, const ParamStore& b) {
  auto va = to_host(a.values()), vb = to_host(b.values());
  for (const auto& p : a.params()) {
    const std::int64_t n = p.valid[0] * (p.shape.size() > 1 ? p.shape[1] : 1);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(va[p.offset + i], vb[p.offset + i]) << p.name;
  }
}
}  // namespace

TEST(Checkpoint, RoundTripIsExactAndLatestIsWritten) {
  Topology topo(MPI_COMM_WORLD, 1, 1);
  const std::string dir = tmpdir("ckpt");
  ParamStore a;
  GptModel ma(cfg(2), a, 1);
  a.allocate();
  a.initialize(3);
  AdamW oa(AdamWConfig{}, a.size(), a.decay_size());
  Kokkos::deep_copy(a.grads(), 0.5f);
  oa.step(a.values(), a.grads(), 1e-3, 1.f);
  CheckpointState st;
  st.model = "gpt";
  st.iteration = 42;
  st.consumed_samples = 4242;
  st.optimizer_steps = oa.steps();
  st.seed = 9;
  st.deck = "[model]\nnum_layers = 2\n";
  const std::string f = save_checkpoint(dir, st, a, &oa, topo);
  EXPECT_EQ(f, dir + "/iter_0000042/checkpoint.h5");
  EXPECT_FALSE(fs::exists(f + ".tmp"));
  EXPECT_EQ(resolve_checkpoint(dir), f);

  ParamStore b;
  GptModel mb(cfg(2), b, 1);
  b.allocate();
  AdamW ob(AdamWConfig{}, b.size(), b.decay_size());
  CheckpointState got = load_checkpoint(resolve_checkpoint(dir), "gpt", b, &ob, topo);
  EXPECT_EQ(got.iteration, 42);
  EXPECT_EQ(got.consumed_samples, 4242);
  EXPECT_EQ(got.deck, st.deck);
  EXPECT_EQ(ob.steps(), 1);
  expect_same_stored_values(a, b);
  auto ma1 = to_host(oa.exp_avg_sq()), mb1 = to_host(ob.exp_avg_sq());
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(ma1[i], mb1[i]);
  fs::remove_all(dir);
}

TEST(Checkpoint, OtherShapeOrKindIsAnErrorNamingTheTensor) {
  Topology topo(MPI_COMM_WORLD, 1, 1);
  const std::string dir = tmpdir("shape");
  ParamStore a;
  GptModel ma(cfg(1), a, 1);
  a.allocate();
  CheckpointState st;
  st.model = "gpt";
  save_checkpoint(dir, st, a, nullptr, topo);
  {
    ParamStore b;
    TransformerConfig c = cfg(1);
    c.hidden_size = 12;
    c.num_heads = 3;
    GptModel mb(c, b, 1);
    b.allocate();
    try {
      load_checkpoint(resolve_checkpoint(dir), "gpt", b, nullptr, topo);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model/"), std::string::npos) << e.what();
    }
  }
  {
    ParamStore b;
    GptModel mb(cfg(2), b, 1);  // one more layer: missing tensors
    b.allocate();
    EXPECT_THROW(load_checkpoint(resolve_checkpoint(dir), "gpt", b, nullptr, topo), Error);
  }
  {
    ParamStore b;
    GptModel mb(cfg(1), b, 1);
    b.allocate();
    try {
      load_checkpoint(resolve_checkpoint(dir), "bert", b, nullptr, topo);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gpt model, not bert"), std::string::npos) << e.what();
    }
    AdamW o(AdamWConfig{}, b.size(), b.decay_size());
    EXPECT_THROW(load_checkpoint(resolve_checkpoint(dir), "gpt", b, &o, topo), Error);  // no optimizer state
  }
  std::ofstream(dir + "/latest") << "7\n";
  EXPECT_THROW(resolve_checkpoint(dir), Error);
  std::ofstream(dir + "/junk.h5") << "not hdf5";
  ParamStore b;
  GptModel mb(cfg(1), b, 1);
  b.allocate();
  EXPECT_THROW(load_checkpoint(dir + "/junk.h5", "gpt", b, nullptr, topo), Error);
  EXPECT_THROW(resolve_checkpoint(dir + "/nope"), Error);
  fs::remove_all(dir);
}

// CheckpointFileWriter (one tensor at a time, in parts) writes the file save_checkpoint writes:
// a store saved by save_checkpoint, read back tensor by tensor by CheckpointFileReader (which
// checks every stored checksum) and streamed into a new checkpoint, loads with load_checkpoint to
// the same values; a changed element is a checksum error naming the tensor.
TEST(Checkpoint, StreamedWriterAndReaderGiveTheFilesOfSaveAndLoad) {
  Topology topo(MPI_COMM_WORLD, 1, 1);
  const std::string dir = tmpdir("stream"), copy = dir + "/copy";
  ParamStore a;
  GptModel ma(cfg(2), a, 1);
  a.allocate();
  a.initialize(5);
  CheckpointState st;
  st.model = "gpt";
  st.iteration = 7;
  st.consumed_samples = 70;
  st.seed = 5;
  st.deck = "[model]\nnum_layers = 2\n";
  const std::string f = save_checkpoint(dir + "/orig", st, a, nullptr, topo);
  {
    CheckpointFileReader r(f, "gpt");
    EXPECT_EQ(r.iteration(), 7);
    EXPECT_EQ(r.int_attribute("consumed_samples"), 70);
    EXPECT_EQ(r.deck(), st.deck);
    const auto names = r.tensors("model/");
    EXPECT_EQ(names.size(), a.params().size() - 0);  // one tensor per parameter (no tied copy at pp 1)
    CheckpointFileWriter w(copy, st);
    for (const auto& n : names) {
      const std::vector<float> v = r.read_all(n);  // checks the checksum
      const auto shape = r.shape(n);
      const std::int64_t inner = shape.size() > 1 ? shape[1] : 1;
      w.write(n, shape, [&](std::int64_t r0, std::int64_t rows, float* out) {
        std::copy(v.begin() + r0 * inner, v.begin() + (r0 + rows) * inner, out);
      });
    }
    EXPECT_EQ(w.commit(), copy + "/iter_0000007/checkpoint.h5");
  }
  ParamStore b;
  GptModel mb(cfg(2), b, 1);
  b.allocate();
  const CheckpointState got = load_checkpoint(resolve_checkpoint(copy), "gpt", b, nullptr, topo);
  EXPECT_EQ(got.iteration, 7);
  EXPECT_EQ(got.consumed_samples, 70);
  expect_same_stored_values(a, b);
  // a writer that never commits leaves no file; a non-finite value is refused naming the tensor
  {
    CheckpointFileWriter w(dir + "/never", st);
    try {
      w.write("model/x", {3}, [](std::int64_t, std::int64_t, float* out) {
        out[0] = 1.f;
        out[1] = std::nanf("");
        out[2] = 0.f;
      });
      ADD_FAILURE() << "NaN written";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model/x"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(dir + "/never/iter_0000007/checkpoint.h5.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/never/latest"));
  // one changed element of the final norm's weight in the file: the reader names the tensor
  {
    haddr_t at = HADDR_UNDEF;
    {
      hid_t h = H5Fopen(f.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      hid_t d = H5Dopen2(h, "model/final_layernorm/weight", H5P_DEFAULT);
      at = H5Dget_offset(d);  // contiguous data: its first byte in the file
      H5Dclose(d);
      H5Fclose(h);
    }
    ASSERT_NE(at, HADDR_UNDEF);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(at + 4));
    const float changed = 123.f;
    io.write(reinterpret_cast<const char*>(&changed), 4);
  }
  try {
    CheckpointFileReader(f, "gpt").read_all("model/final_layernorm/weight");
    ADD_FAILURE() << "a changed element was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model/final_layernorm/weight': checksum"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// The runs of a rank's slice: a tensor split by columns (with padding beyond `valid`) is one run
// per row at its global place; one split by rows is a single run. Each element is covered once.
TEST(Checkpoint, TensorRunsCoverTheSliceOnceAtItsGlobalPlace) {
  ParamInfo p;
  p.name = "model/x";
  p.shape = {4, 6};  // local: 4 rows of 6, the last column padding
  p.global_shape = {8, 12};
  p.global_offset = {4, 6};
  p.valid = {4, 5};
  p.blocks = {ParamInfo::RowBlock{0, 4, 4}};
  const auto runs = tensor_runs(p);
  ASSERT_EQ(runs.size(), 4u);
  for (std::int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(runs[static_cast<size_t>(r)].local, r * 6);
    EXPECT_EQ(runs[static_cast<size_t>(r)].global, (4 + r) * 12 + 6);
    EXPECT_EQ(runs[static_cast<size_t>(r)].n, 5);
  }
  ParamInfo q;
  q.shape = {3, 5};
  q.global_shape = {9, 5};
  q.global_offset = {3, 0};
  q.valid = {3, 5};
  q.blocks = {ParamInfo::RowBlock{0, 3, 3}};
  const auto one = tensor_runs(q);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].local, 0);
  EXPECT_EQ(one[0].global, 15);
  EXPECT_EQ(one[0].n, 15);
  // two row blocks (fused q | kv): local rows 0-1 -> global 2-3, local rows 2-3 -> global 6-7
  q.shape = {4, 5};
  q.global_shape = {8, 5};
  q.valid = {4, 5};
  q.blocks = {ParamInfo::RowBlock{0, 2, 2}, ParamInfo::RowBlock{2, 6, 2}};
  const auto two = tensor_runs(q);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].global, 10);
  EXPECT_EQ(two[1].local, 10);
  EXPECT_EQ(two[1].global, 30);
}

// checksum_terms is the checkpoint checksum's definition (format_version 2), element by element,
// and flags NaN and infinities.
TEST(Checkpoint, ChecksumTermsFollowTheDefinitionAndFlagNonFiniteValues) {
  std::vector<float> x = {1.f, -2.5f, 0.f, 3e-30f, 7.f};
  std::uint64_t want = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    std::uint32_t bits;
    std::memcpy(&bits, &x[j], 4);
    want += checksum_mix((100 + j) * 0x9e3779b97f4a7c15ULL + bits);
  }
  bool finite = true;
  EXPECT_EQ(checksum_terms(x.data(), 100, 5, &finite), want);
  EXPECT_TRUE(finite);
  // split anywhere, the parts add up
  EXPECT_EQ(checksum_terms(x.data(), 100, 2, &finite) + checksum_terms(x.data() + 2, 102, 3, &finite), want);
  x[3] = std::numeric_limits<float>::infinity();
  checksum_terms(x.data(), 100, 5, &finite);
  EXPECT_FALSE(finite);
  finite = true;
  x[3] = std::nanf("");
  checksum_terms(x.data(), 100, 5, &finite);
  EXPECT_FALSE(finite);
}

// write_runs puts every run's bytes at its place and leaves every other byte of the file as it
// was: whole aligned blocks with O_DIRECT, the unaligned ends of a part and small runs through
// the page cache (a neighbour's bytes share those blocks); runs longer than a part (8 MiB), runs
// back to back, on the disk's directory and /dev/shm. Its checksums and counts are the terms' of
// every run.
TEST(Checkpoint, WriteRunsPlaceEveryRunAndNothingElse) {
  std::vector<std::string> dirs = {tmpdir("writeruns")};
  if (fs::is_directory("/dev/shm")) dirs.push_back("/dev/shm");
  for (const std::string& dir : dirs) {
    const std::string path = dir + "/trident_writeruns_" + std::to_string(::getpid()) + ".bin";
    const std::size_t size = (std::size_t{34} << 20) + 4321;
    std::vector<char> want(size);
    std::uint64_t x = 777;
    for (char& c : want) c = static_cast<char>((x = checksum_mix(x)) & 0xff);
    std::ofstream(path, std::ios::binary).write(want.data(), static_cast<std::streamsize>(size));
    const std::vector<std::uint64_t> offsets = {1001, (std::size_t{27} << 20) + 6};  // two "datasets"
    std::vector<float> src((std::size_t{5} << 20) + 3000);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i % 9973) * 0.5f - 7.f;
    std::vector<FileRun> runs = {
        {src.data(), std::int64_t{3} << 20, 0, 0},               // 12 MiB: two parts
        {src.data() + 5, 1000, (std::int64_t{3} << 20) + 9, 0},  // small, after a gap
        {src.data() + 100, 500000, std::int64_t{3} << 21, 0},    // unaligned both ends
        {src.data() + 7, 20000, 0, 1},                           // the second dataset
        {src.data() + 20007, 1 << 20, 20000, 1},                 // back to back with it
    };
    std::vector<std::uint64_t> sums(2, 0), elements(2, 0);
    for (const FileRun& run : runs) {
      bool finite = true;
      sums[run.dataset] += checksum_terms(run.src, static_cast<std::uint64_t>(run.global), run.n, &finite);
      elements[run.dataset] += static_cast<std::uint64_t>(run.n);
      std::memcpy(want.data() + offsets[run.dataset] + run.global * 4, run.src, run.n * 4);
    }
    const RunWriteResult got = write_runs(path, runs, offsets, 2);
    ASSERT_EQ(got.error, "") << dir;
    std::printf("write_runs in %s: O_DIRECT %s, %llu bytes through it\n", dir.c_str(), got.direct ? "open" : "refused",
                static_cast<unsigned long long>(got.direct_bytes));
    if (got.direct) EXPECT_GE(got.direct_bytes, std::uint64_t{15} << 20) << dir;
    EXPECT_EQ(got.sums, sums);
    EXPECT_EQ(got.elements, elements);
    std::ifstream in(path, std::ios::binary);
    std::vector<char> file(size + 1);
    in.read(file.data(), static_cast<std::streamsize>(size + 1));
    ASSERT_EQ(static_cast<std::size_t>(in.gcount()), size) << dir << ": the file's size changed";
    const auto diff = std::mismatch(want.begin(), want.end(), file.begin()).first - want.begin();
    EXPECT_EQ(static_cast<std::size_t>(diff), size) << dir << ": byte " << diff << " differs";
    fs::remove(path);
  }
  fs::remove_all(dirs[0]);
}

// read_jobs gives every job its file bytes, whatever the mix: dense windows (O_DIRECT where the
// file system allows it), sparse strided slices (the page cache), a job longer than a window,
// overlapping jobs, unaligned offsets and the file's last unaligned bytes; the disk's directory
// and /dev/shm (tmpfs). A job past the end of the file is an error naming the truncation.
TEST(Checkpoint, ReadJobsPlaceEveryJobsBytes) {
  std::vector<std::string> dirs = {tmpdir("readjobs")};
  if (fs::is_directory("/dev/shm")) dirs.push_back("/dev/shm");
  for (const std::string& dir : dirs) {
    const std::string path = dir + "/trident_readjobs_" + std::to_string(::getpid()) + ".bin";
    const std::size_t size = (std::size_t{40} << 20) + 1234;  // 40 MiB and a partial block
    std::vector<char> file(size);
    std::uint64_t x = 12345;
    for (char& c : file) c = static_cast<char>((x = checksum_mix(x)) & 0xff);
    std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(size));
    std::vector<std::vector<char>> dst;
    std::vector<ReadJob> jobs;
    auto job = [&](std::uint64_t offset, std::uint64_t bytes) {
      dst.emplace_back(bytes, 0);
      jobs.push_back(ReadJob{offset, bytes, nullptr});
    };
    job(5, 3 << 20);                         // dense, unaligned start
    job((3 << 20) + 5, 100);                 // its neighbour
    job(7, 1000);                            // overlaps the first
    job(size - 2000, 2000);                  // the file's unaligned end
    job(std::uint64_t{4} << 20, 20u << 20);  // longer than a window (16 MiB)
    for (int r = 0; r < 200; ++r)            // sparse: 256 bytes of every 64 KiB
      job((std::uint64_t{26} << 20) + static_cast<std::uint64_t>(r) * 65536 + 3, 256);
    job(0, 0);  // empty
    for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].dst = dst[i].data();
    std::reverse(jobs.begin(), jobs.end());  // (any order)
    // `placed` sees every job's destination bytes, once, in pieces inside it
    std::uint64_t placed_bytes = 0, outside = 0;
    const ReadJobsResult got = read_jobs(path, jobs, [&](const char* p, std::uint64_t n) {
      placed_bytes += n;
      const bool inside = std::any_of(jobs.begin(), jobs.end(),
                                      [&](const ReadJob& j) { return p >= j.dst && p + n <= j.dst + j.bytes; });
      if (!inside) ++outside;
    });
    ASSERT_EQ(got.error, "") << dir;
    std::uint64_t job_bytes = 0;
    for (const ReadJob& j : jobs) job_bytes += j.bytes;
    EXPECT_EQ(placed_bytes, job_bytes) << dir;
    EXPECT_EQ(outside, 0u) << dir;
    std::printf("read_jobs in %s: O_DIRECT %s, %llu bytes through it, %llu through the page cache\n", dir.c_str(),
                got.direct ? "open" : "refused", static_cast<unsigned long long>(got.direct_bytes),
                static_cast<unsigned long long>(got.cached_bytes));
    EXPECT_GT(got.direct_bytes + got.cached_bytes, std::uint64_t{23} << 20) << dir;
    EXPECT_GT(got.cached_bytes, 0u) << dir << ": the sparse slices go through the page cache";
    if (got.direct) EXPECT_GE(got.direct_bytes, std::uint64_t{23} << 20) << dir;
    for (const ReadJob& j : jobs)
      ASSERT_EQ(std::memcmp(j.dst, file.data() + j.offset, j.bytes), 0) << dir << ": job at " << j.offset;
    const ReadJobsResult past = read_jobs(path, {ReadJob{size - 10, 20, dst[0].data()}});
    EXPECT_NE(past.error.find("truncated"), std::string::npos) << past.error;
    EXPECT_NE(read_jobs(path + ".missing", {}).error, "");
    fs::remove(path);
  }
  fs::remove_all(dirs[0]);
}

// RunChecksums taken piecewise, by ranges in any order that cut runs anywhere on element
// boundaries (or miss them), add up to the checksums of the whole runs, their element counts and
// their finiteness, per dataset.
TEST(Checkpoint, RunChecksumsAddUpPiecewiseToTheWholeRuns) {
  std::vector<float> buf(20000);
  std::uint64_t x = 99;
  for (float& f : buf) f = static_cast<float>((x = checksum_mix(x)) % 100000) * 1e-3f - 50.f;
  buf[15000] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<FileRun> runs = {{buf.data() + 9000, 3000, 70, 1},
                                     {buf.data() + 100, 1, 5, 0},
                                     {buf.data() + 14000, 2000, 0, 2},
                                     {buf.data() + 200, 4096, 1 << 20, 0}};
  std::vector<std::uint64_t> want(3, 0), count(3, 0);
  for (const FileRun& r : runs) {
    bool finite = true;
    want[static_cast<size_t>(r.dataset)] += checksum_terms(r.src, static_cast<std::uint64_t>(r.global), r.n, &finite);
    count[static_cast<size_t>(r.dataset)] += static_cast<std::uint64_t>(r.n);
  }
  RunChecksums whole(runs, 3), pieces(runs, 3);
  whole.add_all();
  // the buffer cut at random element boundaries, the ranges added in a shuffled order
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t at = 0; at < buf.size();) {
    const std::size_t n = std::min<std::size_t>(buf.size() - at, 1 + (x = checksum_mix(x)) % 1500);
    ranges.emplace_back(at, n);
    at += n;
  }
  for (std::size_t i = ranges.size(); i > 1; --i) std::swap(ranges[i - 1], ranges[(x = checksum_mix(x)) % i]);
  for (const auto& [at, n] : ranges) pieces.add(reinterpret_cast<const char*>(buf.data() + at), n * sizeof(float));
  for (const RunChecksums* c : {&whole, &pieces}) {
    EXPECT_EQ(c->sums, want);
    EXPECT_EQ(c->elements, count);
    EXPECT_EQ(c->nonfinite, (std::vector<std::uint8_t>{0, 0, 1}));
  }
}

namespace {
// Every tensor of checkpoint file a equals b's, bit for bit (the reader checks both checksums).
void expect_same_tensors(const std::string& a, const std::string& b) {
  CheckpointFileReader ra(a, "gpt"), rb(b, "gpt");
  const auto names = ra.tensors("");
  ASSERT_EQ(names, rb.tensors(""));
  ASSERT_FALSE(names.empty());
  for (const auto& n : names) {
    const auto va = ra.read_all(n), vb = rb.read_all(n);
    ASSERT_EQ(va.size(), vb.size()) << n;
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << n;
  }
}
}  // namespace

// An asynchronous save writes the state as it was at begin(): training may change the model and
// the optimizer while the writer runs. Its file holds bit for bit the tensors of a synchronous
// save of that state, and `latest` moves only at finish().
TEST(Checkpoint, AsynchronousSaveWritesTheStateOfItsBeginAsASynchronousOne) {
  Topology topo(MPI_COMM_WORLD, 1, 1);
  const std::string dir = tmpdir("async");
  ParamStore a;
  GptModel ma(cfg(2), a, 1);
  a.allocate();
  a.initialize(11);
  AdamW oa(AdamWConfig{}, a.size(), a.decay_size());
  Kokkos::deep_copy(a.grads(), 0.25f);
  oa.step(a.values(), a.grads(), 1e-3, 1.f);
  CheckpointState st;
  st.model = "gpt";
  st.iteration = 3;
  st.optimizer_steps = oa.steps();
  const std::string sync_file = save_checkpoint(dir + "/sync", st, a, &oa, topo);
  st.iteration = 2;
  save_checkpoint(dir + "/async", st, a, &oa, topo);  // the previous checkpoint
  st.iteration = 3;
  CheckpointSaver saver;
  saver.begin(dir + "/async", st, a, &oa, topo, true);
  EXPECT_TRUE(saver.pending());
  // training goes on: the model and the moments change under the writer
  Kokkos::deep_copy(a.values(), 7.f);
  Kokkos::deep_copy(oa.exp_avg(), -1.f);
  while (!saver.ready(topo)) {
  }
  EXPECT_EQ(resolve_checkpoint(dir + "/async"), dir + "/async/iter_0000002/checkpoint.h5");  // not yet published
  const std::string f = saver.finish(topo);
  EXPECT_FALSE(saver.pending());
  EXPECT_EQ(f, dir + "/async/iter_0000003/checkpoint.h5");
  EXPECT_EQ(resolve_checkpoint(dir + "/async"), f);
  expect_same_tensors(f, sync_file);
  EXPECT_GT(CheckpointSaver::host_buffer_bytes(a, &oa, topo), 3 * a.padded_size() * 4 - 1);
  fs::remove_all(dir);
}

// A save of a state holding a NaN is refused naming the tensor; it leaves no file and `latest`
// names the previous checkpoint.
TEST(Checkpoint, NonFiniteStateIsRefusedAndLeavesNoFile) {
  Topology topo(MPI_COMM_WORLD, 1, 1);
  const std::string dir = tmpdir("nan");
  ParamStore a;
  GptModel ma(cfg(1), a, 1);
  a.allocate();
  a.initialize(2);
  AdamW oa(AdamWConfig{}, a.size(), a.decay_size());
  CheckpointState st;
  st.model = "gpt";
  st.iteration = 1;
  const std::string first = save_checkpoint(dir, st, a, &oa, topo);
  Kokkos::deep_copy(Kokkos::subview(oa.exp_avg_sq(), std::make_pair(0, 1)), std::nanf(""));
  for (bool async : {false, true}) {
    st.iteration = async ? 3 : 2;
    CheckpointSaver saver;
    saver.begin(dir, st, a, &oa, topo, async);
    try {
      saver.finish(topo);
      ADD_FAILURE() << "a NaN was saved";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refusing to write the checkpoint of iteration"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("optimizer/exp_avg_sq/"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir + "/" + iter_dir_name(st.iteration) + "/checkpoint.h5.tmp"));
    EXPECT_EQ(resolve_checkpoint(dir), first);
  }
  fs::remove_all(dir);
}

// A checkpoint whose datasets were rewritten chunked and compressed (a repacked file) loads
// through HDF5's own reads to the same values.
TEST(Checkpoint, ChunkedAndCompressedDatasetsLoadToTheSameValues) {
  Topology topo(MPI_COMM_WORLD, 1, 1);
  const std::string dir = tmpdir("chunked");
  ParamStore a;
  GptModel ma(cfg(1), a, 1);
  a.allocate();
  a.initialize(4);
  CheckpointState st;
  st.model = "gpt";
  const std::string f = save_checkpoint(dir, st, a, nullptr, topo);
  int rewritten = 0;
  {
    const auto names = CheckpointFileReader(f, "gpt").tensors("model/");
    hid_t h = H5Fopen(f.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(h, 0);
    for (const auto& n : names) {
      hid_t d = H5Dopen2(h, n.c_str(), H5P_DEFAULT);
      hid_t space = H5Dget_space(d);
      const int nd = H5Sget_simple_extent_ndims(space);
      std::vector<hsize_t> dims(static_cast<size_t>(nd));
      H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      hsize_t total = 1;
      for (auto x : dims) total *= x;
      std::vector<float> v(total);
      H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      hid_t attr = H5Aopen(d, "checksum", H5P_DEFAULT);
      hid_t atype = H5Aget_type(attr);
      std::vector<char> sum(H5Tget_size(atype) + 1, 0);
      H5Aread(attr, atype, sum.data());
      H5Aclose(attr);
      H5Dclose(d);
      H5Ldelete(h, n.c_str(), H5P_DEFAULT);
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      std::vector<hsize_t> chunk(dims);
      chunk[0] = std::max<hsize_t>(1, dims[0] / 3);
      H5Pset_chunk(dcpl, nd, chunk.data());
      H5Pset_deflate(dcpl, 4);
      hid_t d2 = H5Dcreate2(h, n.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      ASSERT_GE(d2, 0) << n;
      H5Dwrite(d2, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      hid_t aspace = H5Screate(H5S_SCALAR);
      hid_t a2 = H5Acreate2(d2, "checksum", atype, aspace, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a2, atype, sum.data());
      H5Aclose(a2);
      H5Sclose(aspace);
      H5Tclose(atype);
      H5Dclose(d2);
      H5Pclose(dcpl);
      H5Sclose(space);
      ++rewritten;
    }
    H5Fclose(h);
  }
  ASSERT_GT(rewritten, 3);
  ParamStore b;
  GptModel mb(cfg(1), b, 1);
  b.allocate();
  load_checkpoint(f, "gpt", b, nullptr, topo);
  expect_same_stored_values(a, b);
  fs::remove_all(dir);
}
