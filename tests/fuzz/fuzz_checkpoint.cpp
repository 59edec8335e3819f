// libFuzzer harness: the checkpoint reader (read_checkpoint_deck, load_checkpoint) on one MPI
// rank. The input chooses the contents of a checkpoint of a two-tensor model: root attributes
// (format, version, model kind, counters, the stored deck, as text from the input), each tensor
// present or not, its shape, type and values (NaN and inf included), and its checksum attribute
// (right, wrong, absent, or of another type); the harness writes them with HDF5 into a
// well-formed container. The reader must load it or throw trident::Error, and a load that
// succeeds must have verified what it promises: a version-2 file with every checksum right, only
// finite values, and the store holding exactly the values written.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/topology.hpp"
#include "common/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "io/hdf5_handle.hpp"
#include "layers/param_store.hpp"

using trident::H5Handle;

namespace {
std::unique_ptr<trident::Topology> topo;
std::unique_ptr<trident::ParamStore> store;
const std::vector<std::pair<std::string, std::vector<hsize_t>>> kTensors = {{"model/a", {3, 4}}, {"model/b", {5}}};

std::string file_path() {
  static const std::string p = "/tmp/trident_fuzz_checkpoint_" + std::to_string(::getpid()) + ".h5";
  return p;
}

// The checksum of docs/checkpoints.md "Integrity", written out independently of src/io/checkpoint.cpp.
std::string reference_checksum(const std::vector<float>& v) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL + bits + 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    sum += x ^ (x >> 31);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(sum));
  return buf;
}

const char* kDeck =
    "[model]\nnum_layers = 1\nhidden_size = 4\nnum_heads = 1\nseq_length = 4\n[train]\nglobal_batch_size = 1\n"
    "iters = 1\n[data]\ntrain_shards = x.h5\n";

struct Written {
  bool version2 = false, all_checksums_right = true, all_finite = true, complete = true;
  std::vector<std::vector<float>> values;
};

Written write_checkpoint(FuzzedDataProvider& in) {
  Written w;
  H5Handle f = trident::h5_file(H5Fcreate(file_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) std::abort();
  const char* formats[] = {"trident.checkpoint", "trident.tokens", ""};
  if (in.ConsumeIntegralInRange(0, 15) > 0)
    trident::h5_write_attr(f, "format", std::string(formats[in.ConsumeIntegralInRange(0, 2)]));
  const std::int64_t version = in.ConsumeIntegralInRange<std::int64_t>(0, 3);
  if (in.ConsumeIntegralInRange(0, 15) > 0) trident::h5_write_attr(f, "format_version", version);
  w.version2 = version == 2;
  const char* models[] = {"gpt", "bert", "t5", ""};
  if (in.ConsumeIntegralInRange(0, 15) > 0)
    trident::h5_write_attr(f, "model", std::string(models[in.ConsumeIntegralInRange(0, 3)]));
  for (const char* k : {"iteration", "consumed_samples", "optimizer_steps", "seed", "has_optimizer"})
    if (in.ConsumeIntegralInRange(0, 15) > 0) trident::h5_write_attr(f, k, in.ConsumeIntegral<std::int64_t>());
  if (in.ConsumeIntegralInRange(0, 15) > 0) trident::h5_write_attr(f, "loss_scale", in.ConsumeFloatingPoint<double>());
  if (in.ConsumeIntegralInRange(0, 15) > 0)
    trident::h5_write_attr(f, "deck", in.ConsumeBool() ? std::string(kDeck) : in.ConsumeRandomLengthString(400));
  for (const auto& [name, dims] : kTensors) {
    std::vector<float> v;
    if (in.ConsumeIntegralInRange(0, 15) == 0) {
      w.complete = false;
      w.values.push_back(v);
      continue;
    }
    std::vector<hsize_t> shape = dims;
    if (in.ConsumeIntegralInRange(0, 7) == 0) shape[0] = in.ConsumeIntegralInRange<hsize_t>(0, 6);
    if (in.ConsumeIntegralInRange(0, 15) == 0) shape.push_back(1);
    hsize_t n = 1;
    for (auto d : shape) n *= d;
    for (hsize_t i = 0; i < n; ++i) {
      const int kind = in.ConsumeIntegralInRange(0, 40);
      float x = kind == 0   ? std::numeric_limits<float>::quiet_NaN()
                : kind == 1 ? std::numeric_limits<float>::infinity()
                            : static_cast<float>(in.ConsumeIntegralInRange(-1000, 1000)) / 64.f;
      w.all_finite = w.all_finite && std::isfinite(x);
      v.push_back(x);
    }
    trident::h5_make_parents(f, name);
    H5Handle space = trident::h5_space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
    const hid_t type = in.ConsumeIntegralInRange(0, 15) == 0 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE;
    H5Handle d = trident::h5_dataset(H5Dcreate2(f, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (n) H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    const int sum = in.ConsumeIntegralInRange(0, 9);
    if (sum <= 6) {
      trident::h5_write_attr(d, "checksum", reference_checksum(v));
    } else if (sum == 7) {
      w.all_checksums_right = false;
      trident::h5_write_attr(d, "checksum", in.ConsumeRandomLengthString(20));
    } else if (sum == 8) {
      w.all_checksums_right = false;
      trident::h5_write_attr(d, "checksum", in.ConsumeIntegral<std::int64_t>());
    } else {
      w.all_checksums_right = false;  // absent
    }
    if (shape != dims) w.complete = false;
    w.values.push_back(v);
  }
  return w;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  Kokkos::initialize();
  topo = std::make_unique<trident::Topology>(MPI_COMM_WORLD, 1, 1);
  store = std::make_unique<trident::ParamStore>();
  for (const auto& [name, dims] : kTensors)
    store->declare(name, std::vector<std::int64_t>(dims.begin(), dims.end()), false, 0.02f);
  store->allocate();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  Written w;
  {
    trident::H5QuietErrors quiet;
    w = write_checkpoint(in);
  }
  try {
    (void)trident::read_checkpoint_deck(file_path(), "gpt", MPI_COMM_WORLD);
  } catch (const trident::Error&) {
  }
  try {
    trident::load_checkpoint(file_path(), "gpt", *store, nullptr, *topo);
  } catch (const trident::Error&) {
    return 0;
  }
  // loaded: everything it checks must have held
  if (!w.complete || !w.all_finite || (w.version2 && !w.all_checksums_right)) {
    std::fprintf(stderr, "loaded a checkpoint it should refuse (complete %d, finite %d, version 2 %d, checksums %d)\n",
                 w.complete, w.all_finite, w.version2, w.all_checksums_right);
    std::abort();
  }
  const auto host = store->model_to_host();
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    const auto& info = store->info(static_cast<trident::ParamId>(t));
    for (std::size_t i = 0; i < w.values[t].size(); ++i)
      if (host(static_cast<std::size_t>(info.offset) + i) != w.values[t][i]) std::abort();
  }
  return 0;
}
