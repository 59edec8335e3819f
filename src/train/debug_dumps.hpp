// Debugging and validation taps of the trainer (docs/DESIGN.md "Input deck", [debug]):
// debug.dump_batches (every global batch, as its family encodes the samples) and
// debug.dump_dropout (every dropout mask of a one-rank run), read by validation/.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "io/hdf5_handle.hpp"
#include "ops/dropout.hpp"

namespace trident {

// Rank 0 writes every global batch (validation): /iter_NNNNNNN int32 [GB, width], a row being one
// sample as its family encodes it (GPT: S+1 tokens; BERT: 4S+1; T5: 2S+2S_d; validation/README.md).
class BatchDumper {
 public:
  BatchDumper(const std::string& path, bool resume) : path_(path) {
    H5QuietErrors quiet;
    if (resume) file_ = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    if (!file_.valid()) file_ = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!file_.valid()) throw Error::one("debug.dump_batches: cannot create '" + path + "'");
  }
  void write(std::int64_t it, const std::vector<std::int32_t>& rows, std::int64_t n, std::int64_t w) {
    char name[32];
    std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(it));
    H5QuietErrors quiet;
    if (H5Lexists(file_, name, H5P_DEFAULT) > 0) H5Ldelete(file_, name, H5P_DEFAULT);
    hsize_t dims[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(w)};
    H5Handle sp = h5_space(H5Screate_simple(2, dims, nullptr));
    H5Handle ds = h5_dataset(H5Dcreate2(file_, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data());
    H5Fflush(file_, H5F_SCOPE_LOCAL);
  }

 private:
  std::string path_;
  H5Handle file_;
};

// debug.dump_dropout: the mask of every forward dropout call of a one-rank run, in call order, as
// /NNNNNNN uint8 datasets (1 kept, 0 dropped) with attributes site, layer, iteration and p. The
// masks come from the counter-based uniform the kernels evaluate (dropout_uniform(key, i) >= p).
// They are kept in memory during the forward passes and written by flush() between iterations:
// the data prefetcher reads shards through HDF5 on a helper thread meanwhile, and HDF5 is not
// thread-safe.
class DropoutTape {
 public:
  DropoutTape(const std::string& path, const std::int64_t* iteration) : iteration_(iteration) {
    H5QuietErrors quiet;
    file_ = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!file_.valid()) throw Error::one("debug.dump_dropout: cannot create '" + path + "'");
    set_dropout_recorder([this](const char* site, std::int64_t layer, const DropoutSpec& d,
                                const std::vector<std::int64_t>& shape) { record(site, layer, d, shape); });
  }
  ~DropoutTape() { set_dropout_recorder(nullptr); }
  DropoutTape(const DropoutTape&) = delete;
  DropoutTape& operator=(const DropoutTape&) = delete;

  void flush() {
    H5QuietErrors quiet;
    for (const Mask& m : pending_) {
      char name[32];
      std::snprintf(name, sizeof(name), "%07lld", static_cast<long long>(written_++));
      std::vector<hsize_t> dims(m.shape.begin(), m.shape.end());
      H5Handle sp = h5_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
      H5Handle ds = h5_dataset(H5Dcreate2(file_, name, H5T_STD_U8LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      if (!ds.valid() || H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.keep.data()) < 0)
        throw Error::one(std::string("debug.dump_dropout: cannot write mask ") + name);
      h5_write_attr(ds, "site", m.site);
      h5_write_attr(ds, "layer", m.layer);
      h5_write_attr(ds, "iteration", m.iteration);
      h5_write_attr(ds, "p", m.p);
    }
    pending_.clear();
    H5Fflush(file_, H5F_SCOPE_LOCAL);
  }

 private:
  struct Mask {
    std::string site;
    std::int64_t layer, iteration;
    double p;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> keep;
  };

  void record(const char* site, std::int64_t layer, const DropoutSpec& d, const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    Mask m{site,        layer,
           *iteration_, static_cast<double>(d.p),
           shape,       std::vector<std::uint8_t>(static_cast<size_t>(n))};
    for (std::int64_t i = 0; i < n; ++i)
      m.keep[static_cast<size_t>(i)] = dropout_uniform(d.key, static_cast<std::uint64_t>(i)) >= d.p;
    pending_.push_back(std::move(m));
  }

  H5Handle file_;
  const std::int64_t* iteration_;
  std::vector<Mask> pending_;
  std::int64_t written_ = 0;
};

}  // namespace trident
