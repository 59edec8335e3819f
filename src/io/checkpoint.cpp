// HDF5 checkpoint writer/reader (parallel HDF5 for writing, independent reads for loading).
#include "io/checkpoint.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>

#include "common/error.hpp"
#include "io/hdf5_handle.hpp"

namespace fs = std::filesystem;

namespace trident {

namespace {

std::string iter_dir_name(std::int64_t it) {
  std::ostringstream os;
  os << "iter_" << std::setw(7) << std::setfill('0') << it;
  return os.str();
}

std::string shape_str(const std::vector<hsize_t>& d) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

// Ranks that hold a unique copy of their slice write it: one replica per data-parallel group.
bool writes_slice(const Topology& topo) { return topo.coords().dp == 0; }

H5Handle open_parallel_create(const std::string& path, MPI_Comm comm) {
  H5Handle fapl = h5_plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  H5Handle f = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  return f;
}

// Calls f(memory space, file space) once per row block of p with the selections that map this
// rank's local slice onto the global tensor.
template <class F>
void for_each_block(const ParamInfo& p, F&& f, hid_t fspace) {
  const int nd = static_cast<int>(p.shape.size());
  const hsize_t nb = static_cast<hsize_t>(p.row_blocks);
  std::vector<hsize_t> ldims(p.shape.begin(), p.shape.end());
  H5Handle mspace = h5_space(H5Screate_simple(nd, ldims.data(), nullptr));
  for (hsize_t b = 0; b < nb; ++b) {
    std::vector<hsize_t> mstart(nd, 0), count(p.valid.begin(), p.valid.end()),
        fstart(p.global_offset.begin(), p.global_offset.end());
    mstart[0] = b * ldims[0] / nb;
    fstart[0] += b * static_cast<hsize_t>(p.global_shape[0]) / nb;
    H5Sselect_hyperslab(mspace, H5S_SELECT_SET, mstart.data(), nullptr, count.data(), nullptr);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, fstart.data(), nullptr, count.data(), nullptr);
    f(mspace.get(), fspace);
  }
}

// The union over all ranks of (name, global shape) of the tensors they hold: with pipeline
// parallelism ranks hold different tensors, but parallel HDF5 creates datasets collectively,
// so every rank creates every dataset, in the same (sorted) order.
std::map<std::string, std::vector<hsize_t>> all_tensors(const ParamStore& store, MPI_Comm comm) {
  std::string mine;
  for (const auto& p : store.params()) {
    if (p.tied_copy) continue;
    mine += p.name;
    for (auto d : p.global_shape) mine += " " + std::to_string(d);
    mine += "\n";
  }
  int size = 0;
  MPI_Comm_size(comm, &size);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), offs(size, 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  for (int r = 1; r < size; ++r) offs[r] = offs[r - 1] + lens[r - 1];
  std::string all(static_cast<size_t>(offs[size - 1] + lens[size - 1]), '\0');
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm);
  std::map<std::string, std::vector<hsize_t>> out;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    std::vector<hsize_t> dims;
    for (hsize_t d; ls >> d;) dims.push_back(d);
    out[name] = dims;
  }
  return out;
}

// Writes every parameter of `store` from `host` (a host copy of a buffer laid out like the
// store) as global datasets prefix + name. Collective: every rank creates every dataset of
// `tensors` (all_tensors), and writes the slices it owns.
void write_tensors(hid_t file, const std::string& prefix, const ParamStore& store, const float* host, bool i_write,
                   int tp_rank, const std::map<std::string, std::vector<hsize_t>>& tensors) {
  for (const auto& [pname, gdims] : tensors) {
    const std::string name = prefix + pname;
    h5_make_parents(file, name);
    H5Handle fspace = h5_space(H5Screate_simple(static_cast<int>(gdims.size()), gdims.data(), nullptr));
    H5Handle dset = h5_dataset(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, fspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!dset.valid()) throw Error::one("checkpoint: cannot create dataset '" + name + "'");
    const ParamId id = store.find(pname);
    if (id < 0) continue;
    const ParamInfo& p = store.info(id);
    if (!i_write || p.tied_copy || (p.tp_replicated && tp_rank != 0)) continue;  // one copy of each tensor
    for_each_block(p, [&](hid_t mspace, hid_t fsel) {
      if (H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fsel, H5P_DEFAULT, host + p.offset) < 0)
        throw Error::one("checkpoint: writing '" + name + "' failed");
    }, fspace);
  }
}

void read_tensors(hid_t file, const std::string& prefix, const ParamStore& store, float* host,
                  const std::string& where) {
  for (const auto& p : store.params()) {
    const std::string name = prefix + p.name;
    TRIDENT_REQUIRE(H5Lexists(file, name.substr(0, name.find('/')).c_str(), H5P_DEFAULT) > 0 &&
                        H5Oexists_by_name(file, name.c_str(), H5P_DEFAULT) > 0,
                    "checkpoint " << where << " has no tensor '" << name << "'");
    H5Handle dset = h5_dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
    const auto dims = h5_dims(dset);
    std::vector<hsize_t> want(p.global_shape.begin(), p.global_shape.end());
    TRIDENT_REQUIRE(dims == want, "checkpoint " << where << ": tensor '" << name << "' has shape " << shape_str(dims)
                                                << " but this model needs " << shape_str(want));
    H5Handle fspace = h5_space(H5Dget_space(dset));
    for_each_block(p, [&](hid_t mspace, hid_t fsel) {
      TRIDENT_REQUIRE(H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fsel, H5P_DEFAULT, host + p.offset) >= 0,
                      "checkpoint " << where << ": reading '" << name << "' failed");
    }, fspace);
  }
}

void make_dirs(const std::string& d) {
  std::error_code ec;
  fs::create_directories(d, ec);
  TRIDENT_REQUIRE(!ec, "cannot create directory '" << d << "': " << ec.message());
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error::one("cannot write '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error::one("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
}

// Full-size host copy of an optimizer moment; the distributed optimizer's shards are gathered
// over the data-parallel group first (collective there).
HostFloatView full_state(const FloatView& part, const AdamW& opt, const ParamStore& store, const Topology& topo) {
  const std::int64_t N = store.padded_size();
  if (opt.size() == N) return Kokkos::create_mirror_view_and_copy(HostSpace(), part);
  FloatView full = make_float("checkpoint::optimizer_state", N);
  Kokkos::deep_copy(slice(full, opt.begin(), opt.size()), part);
  topo.dp_group().allgather_in_place(full.data(), opt.size());
  return Kokkos::create_mirror_view_and_copy(HostSpace(), full);
}

// This optimizer's part [begin, begin + n) of a full-size host buffer, to the device.
void load_state(const FloatView& part, const HostFloatView& full, const AdamW& opt) {
  auto mirror = Kokkos::create_mirror_view(part);
  Kokkos::deep_copy(mirror, Kokkos::subview(full, Kokkos::make_pair(opt.begin(), opt.begin() + opt.size())));
  Kokkos::deep_copy(part, mirror);
}

}  // namespace

std::string save_checkpoint(const std::string& save_dir, const CheckpointState& st, const ParamStore& store,
                            const AdamW* opt, const Topology& topo) {
  const Communicator& world = topo.world();
  const std::string dir = save_dir + "/" + iter_dir_name(st.iteration);
  const std::string final_path = dir + "/checkpoint.h5", tmp_path = final_path + ".tmp";
  collectively(world.get(), [&] {
    if (world.rank() == 0) make_dirs(dir);
  });
  auto values = store.model_to_host();  // 16-bit parameters widened: stored as fp32 tensors
  HostFloatView m, v, master;
  if (opt) {
    m = full_state(opt->exp_avg(), *opt, store, topo);
    v = full_state(opt->exp_avg_sq(), *opt, store, topo);
    if (opt->has_master()) master = full_state(opt->master(), *opt, store, topo);
  }
  std::string err;
  {
    H5QuietErrors quiet;
    H5Handle file = open_parallel_create(tmp_path, world.get());
    if (!file.valid()) err = "cannot create checkpoint file '" + tmp_path + "'";
    agree_or_throw(world.get(), err);
    const bool w = writes_slice(topo);
    const auto tensors = all_tensors(store, world.get());
    write_tensors(file, "", store, values.data(), w, topo.coords().tp, tensors);
    if (opt) {
      write_tensors(file, "optimizer/exp_avg/", store, m.data(), w, topo.coords().tp, tensors);
      write_tensors(file, "optimizer/exp_avg_sq/", store, v.data(), w, topo.coords().tp, tensors);
      if (opt->has_master()) write_tensors(file, "optimizer/master/", store, master.data(), w, topo.coords().tp, tensors);
    }
    // Attributes are written collectively (same values on every rank).
    h5_write_attr(file, "format", std::string(kCheckpointFormat));
    h5_write_attr(file, "format_version", kCheckpointVersion);
    h5_write_attr(file, "model", st.model);
    h5_write_attr(file, "iteration", st.iteration);
    h5_write_attr(file, "consumed_samples", st.consumed_samples);
    h5_write_attr(file, "optimizer_steps", st.optimizer_steps);
    h5_write_attr(file, "seed", st.seed);
    h5_write_attr(file, "loss_scale", st.loss_scale);
    h5_write_attr(file, "loss_scale_growth_tracker", st.loss_scale_growth_tracker);
    h5_write_attr(file, "loss_scale_hysteresis_tracker", st.loss_scale_hysteresis_tracker);
    h5_write_attr(file, "skipped_iterations", st.skipped_iterations);
    h5_write_attr(file, "dtype", st.dtype);
    h5_write_attr(file, "deck", st.deck);
    h5_write_attr(file, "has_optimizer", static_cast<std::int64_t>(opt ? 1 : 0));
    h5_write_attr(file, "parallel_layout", "tp=" + std::to_string(topo.tp_size()) + " pp=" +
                                               std::to_string(topo.pp_size()) + " dp=" + std::to_string(topo.dp_size()));
    if (H5Fclose(file.release()) < 0) err = "closing checkpoint file '" + tmp_path + "' failed";
  }
  agree_or_throw(world.get(), err);
  collectively(world.get(), [&] {
    if (world.rank() != 0) return;
    if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      throw Error::one("cannot rename '" + tmp_path + "': " + std::strerror(errno));
    write_text_atomically(save_dir + "/latest", std::to_string(st.iteration) + "\n");
  });
  return final_path;
}

std::string resolve_checkpoint(const std::string& load) {
  std::error_code ec;
  TRIDENT_REQUIRE(fs::exists(load, ec), "checkpoint.load: '" << load << "' does not exist");
  if (fs::is_regular_file(load, ec)) return load;
  if (fs::exists(load + "/checkpoint.h5", ec)) return load + "/checkpoint.h5";
  const std::string latest = load + "/latest";
  TRIDENT_REQUIRE(fs::exists(latest, ec), "checkpoint.load: '" << load << "' has neither 'latest' nor checkpoint.h5");
  std::ifstream in(latest);
  std::int64_t it = -1;
  in >> it;
  TRIDENT_REQUIRE(in && it >= 0, "checkpoint.load: '" << latest << "' does not hold an iteration number");
  const std::string file = load + "/" + iter_dir_name(it) + "/checkpoint.h5";
  TRIDENT_REQUIRE(fs::exists(file, ec), "checkpoint.load: 'latest' names iteration " << it << " but '" << file
                                                                                     << "' is missing");
  return file;
}

namespace {
// Opens a checkpoint and checks its format, version and model kind (inside `collectively`).
H5Handle open_checkpoint(const std::string& path, const std::string& expected_model) {
  TRIDENT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "checkpoint '" << path << "' is not an HDF5 file");
  H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  TRIDENT_REQUIRE(file.valid(), "cannot open checkpoint '" << path << "'");
  const std::string fmt = h5_has_attr(file, "format") ? h5_read_attr_string(file, "format", path) : "";
  TRIDENT_REQUIRE(fmt == kCheckpointFormat, "'" << path << "' is not a Trident checkpoint (format '" << fmt << "')");
  const auto ver = h5_read_attr_int(file, "format_version", path);
  TRIDENT_REQUIRE(ver <= kCheckpointVersion, "checkpoint '" << path << "' has format_version " << ver
                                                            << ", newer than this Trident (" << kCheckpointVersion << ")");
  const std::string model = h5_read_attr_string(file, "model", path);
  TRIDENT_REQUIRE(model == expected_model, "checkpoint '" << path << "' holds a " << model << " model, not "
                                                          << expected_model);
  return file;
}
}  // namespace

std::string read_checkpoint_deck(const std::string& path, const std::string& expected_model, MPI_Comm world) {
  std::string deck;
  collectively(world, [&] {
    H5QuietErrors quiet;
    H5Handle file = open_checkpoint(path, expected_model);
    deck = h5_read_attr_string(file, "deck", path);
  });
  return deck;
}

CheckpointState load_checkpoint(const std::string& path, const std::string& expected_model, ParamStore& store,
                                AdamW* opt, const Topology& topo) {
  CheckpointState st;
  HostFloatView values(std::string("checkpoint::values"), static_cast<size_t>(store.padded_size()));
  HostFloatView m, v, master;
  bool has_master = false;
  if (opt) {
    m = HostFloatView(std::string("checkpoint::exp_avg"), static_cast<size_t>(store.padded_size()));
    v = HostFloatView(std::string("checkpoint::exp_avg_sq"), static_cast<size_t>(store.padded_size()));
  }
  collectively(topo.world().get(), [&] {
    H5QuietErrors quiet;
    H5Handle file = open_checkpoint(path, expected_model);
    st.model = expected_model;
    st.iteration = h5_read_attr_int(file, "iteration", path);
    st.consumed_samples = h5_read_attr_int(file, "consumed_samples", path);
    st.optimizer_steps = h5_read_attr_int(file, "optimizer_steps", path);
    st.seed = h5_read_attr_int(file, "seed", path);
    st.loss_scale = h5_read_attr_double(file, "loss_scale", path);
    st.deck = h5_read_attr_string(file, "deck", path);
    read_tensors(file, "", store, values.data(), path);
    if (opt) {
      TRIDENT_REQUIRE(h5_read_attr_int(file, "has_optimizer", path) == 1,
                      "checkpoint '" << path << "' has no optimizer state to resume from");
      read_tensors(file, "optimizer/exp_avg/", store, m.data(), path);
      read_tensors(file, "optimizer/exp_avg_sq/", store, v.data(), path);
      // fp32 master weights of a 16-bit run; without them (a checkpoint of an fp32 run) the
      // masters start from the model's values
      has_master = opt->has_master() && H5Lexists(file, "optimizer/master", H5P_DEFAULT) > 0;
      if (has_master) {
        master = HostFloatView(std::string("checkpoint::master"), static_cast<size_t>(store.padded_size()));
        read_tensors(file, "optimizer/master/", store, master.data(), path);
      }
    }
    if (h5_has_attr(file, "loss_scale_growth_tracker")) {
      st.loss_scale_growth_tracker = h5_read_attr_int(file, "loss_scale_growth_tracker", path);
      st.loss_scale_hysteresis_tracker = h5_read_attr_int(file, "loss_scale_hysteresis_tracker", path);
      st.skipped_iterations = h5_read_attr_int(file, "skipped_iterations", path);
    }
  });
  store.model_from_host(values);
  if (opt) {
    load_state(opt->exp_avg(), m, *opt);
    load_state(opt->exp_avg_sq(), v, *opt);
    if (opt->has_master()) {
      if (has_master)
        load_state(opt->master(), master, *opt);
      else  // from an fp32 checkpoint: the exact fp32 values, not their 16-bit rounding
        load_state(opt->master(), values, *opt);
    }
    opt->set_steps(st.optimizer_steps);
  }
  return st;
}

void save_named_tensors(const std::string& path, const std::string& prefix, const ParamStore& store,
                        const FloatView& buffer, std::int64_t iteration, const Topology& topo) {
  auto host = Kokkos::create_mirror_view_and_copy(HostSpace(), buffer);
  std::string err;
  H5QuietErrors quiet;
  H5Handle file = open_parallel_create(path, topo.world().get());
  if (!file.valid()) err = "cannot create '" + path + "'";
  agree_or_throw(topo.world().get(), err);
  write_tensors(file, prefix, store, host.data(), writes_slice(topo), topo.coords().tp,
                all_tensors(store, topo.world().get()));
  h5_write_attr(file, "iteration", iteration);
}

}  // namespace trident
