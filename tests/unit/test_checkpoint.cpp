// Checkpoint round trip (one rank): parameters and optimizer state come back bit for bit,
// 'latest' and the atomic rename, and shape/kind mismatches are errors naming the tensor.
#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "checkpoint/checkpoint.hpp"
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
  auto va = to_host(a.values()), vb = to_host(b.values());
  // padded embedding rows are not stored: compare the stored part of every parameter
  for (const auto& p : a.params()) {
    const std::int64_t n = p.valid[0] * (p.shape.size() > 1 ? p.shape[1] : 1);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(va[p.offset + i], vb[p.offset + i]) << p.name;
  }
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
  auto va = to_host(a.values()), vb = to_host(b.values());
  for (const auto& p : a.params()) {
    const std::int64_t n = p.valid[0] * (p.shape.size() > 1 ? p.shape[1] : 1);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(va[p.offset + i], vb[p.offset + i]) << p.name;
  }
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
