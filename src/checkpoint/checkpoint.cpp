// Checkpoint save and load (docs/DESIGN.md "Checkpoints"). Every parameter, and the AdamW moments
// and fp32 masters, is a contiguous float32 dataset of its global shape. Saving (CheckpointSaver):
// rank 0 creates checkpoint.h5.tmp with every dataset allocated; every rank writes the runs of
// elements it owns (the distributed optimizer's shards as they are, never gathered) into the
// datasets' bytes with pwrite, checksumming each part as it goes (order-independent sums, so the
// ranks' parts add up with one all-reduce) and flushes it (fsync); rank 0 writes the checksum
// attributes, renames the file and rewrites `latest` (written, flushed, renamed, its directory
// flushed). Loading reads each rank's slices and optimizer shards from the datasets' bytes with
// pread (through HDF5 for a file repacked with chunks or filters), checks format, model, shapes,
// checksums and finiteness on every rank, and changes the store and the optimizer only after all
// of that passed ("Save and load").
#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/agreement.hpp"
#include "comm/communicator.hpp"
#include "common/error.hpp"
#include "common/timer.hpp"
#include "checkpoint/tensor_runs.hpp"
#include "io/hdf5_handle.hpp"

namespace fs = std::filesystem;

namespace trident {

std::string iter_dir_name(std::int64_t it) {
  std::ostringstream os;
  os << "iter_" << std::setw(7) << std::setfill('0') << it;
  return os.str();
}

namespace {

std::string shape_str(const std::vector<hsize_t>& d) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

// Which slices a rank writes (and counts in the checksums): one replica of each. Dense tensors:
// the ranks of data-parallel rank 0, replicated ones from tensor-parallel rank 0 only; MoE
// experts: the ranks of expert-data-parallel rank 0 (every expert-parallel rank holds others).
struct Owner {
  bool dense = false, expert = false;  // data-parallel rank 0; expert-data-parallel rank 0
  int tp = 0, etp = 0;
  bool owns(const ParamInfo& p) const {
    if (p.tied_copy) return false;
    if (p.expert) return expert && !(p.tp_replicated && etp != 0);  // tp_replicated: over expert_tp
    return dense && !(p.tp_replicated && tp != 0);
  }
};
Owner owner_of(const Topology& topo) {
  return Owner{topo.coords().dp == 0 && topo.coords().cp == 0, topo.expert_coords().edp == 0, topo.coords().tp,
               topo.expert_coords().etp};
}

H5Handle open_parallel_create(const std::string& path, MPI_Comm comm) {
  H5Handle fapl = h5_plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  H5Handle f = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  return f;
}

// The row blocks of p: this rank's local slice maps onto the global tensor as one box per row
// block (ParamInfo::blocks: start in the local tensor, start in the global tensor, extent).
struct Block {
  std::vector<hsize_t> mstart, fstart, count;  // (ndims) each
};

std::vector<Block> blocks_of(const ParamInfo& p) {
  const int nd = static_cast<int>(p.shape.size());
  std::vector<Block> out;
  for (const auto& b : p.blocks) {
    Block k{std::vector<hsize_t>(nd, 0), std::vector<hsize_t>(p.global_offset.begin(), p.global_offset.end()),
            std::vector<hsize_t>(p.valid.begin(), p.valid.end())};
    k.mstart[0] = static_cast<hsize_t>(b.local0);
    k.fstart[0] = static_cast<hsize_t>(b.global0);
    k.count[0] = static_cast<hsize_t>(b.rows);
    out.push_back(std::move(k));
  }
  return out;
}

// Calls f(memory space, file space) once per row block of p with the selections that map this
// rank's local slice onto the global tensor.
template <class F>
void for_each_block(const ParamInfo& p, F&& f, hid_t fspace) {
  const int nd = static_cast<int>(p.shape.size());
  std::vector<hsize_t> ldims(p.shape.begin(), p.shape.end());  // (ndims): the local shape
  H5Handle mspace = h5_space(H5Screate_simple(nd, ldims.data(), nullptr));
  for (const Block& k : blocks_of(p)) {
    H5Sselect_hyperslab(mspace, H5S_SELECT_SET, k.mstart.data(), nullptr, k.count.data(), nullptr);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, k.fstart.data(), nullptr, k.count.data(), nullptr);
    f(mspace.get(), fspace);
  }
}

// Checksums (format_version 2): every dataset carries the attribute `checksum`, 16 hex digits of
// the sum (mod 2^64) over its elements of splitmix64(global row-major index * K + the element's
// fp32 bits). A sum of per-element terms does not depend on the order of the elements, so each
// rank adds up the slices it owns, under any parallel layout, and one all-reduce gives the
// tensor's checksum, when writing as when loading. A change of any single element changes it.
constexpr const char* kChecksumAlgorithm = "sum64(splitmix64(index*0x9e3779b97f4a7c15+fp32 bits))";

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The union over all ranks of (name, global shape) of the tensors they hold: with pipeline
// parallelism ranks hold different tensors, but parallel HDF5 creates datasets collectively,
// so every rank creates every dataset, in the same (sorted) order.
bool in_set(const ParamInfo& p, TensorSet set) {
  return set == TensorSet::all || (set == TensorSet::adapters) == p.adapter;
}

// With states false, the model's states (ParamInfo::state: no optimizer state) are left out.
std::map<std::string, std::vector<hsize_t>> all_tensors(const ParamStore& store, MPI_Comm comm,
                                                        TensorSet set = TensorSet::all, bool states = true) {
  std::string mine;
  for (const auto& p : store.params()) {
    if (p.tied_copy || !in_set(p, set) || (p.state && !states)) continue;
    mine += p.name;
    for (auto d : p.global_shape) mine += " " + std::to_string(d);
    mine += "\n";
  }
  std::string all;
  for (const auto& text : Communicator::borrow(comm).allgather_text(mine)) all += text;
  std::map<std::string, std::vector<hsize_t>> out;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    std::vector<hsize_t> dims;  // the global shape
    for (hsize_t d; ls >> d;) dims.push_back(d);
    out[name] = dims;
  }
  return out;
}

// Writes every parameter of `store` from `host` (a host copy of a buffer laid out like the
// store) as global datasets prefix + name. Collective: every rank creates every dataset of
// `tensors` (all_tensors), and writes the slices it owns.
// `sums`: the datasets' checksums (checksums()), in the order of `tensors`, or empty for none.
// A slice whose write fails (a full disk fails some ranks' writes and not others') is agreed on
// before the next tensor's collective creation: every rank throws the same Error::all there.
void write_tensors(hid_t file, MPI_Comm comm, const std::string& where, const std::string& prefix,
                   const ParamStore& store, const float* host, const Owner& owner,
                   const std::map<std::string, std::vector<hsize_t>>& tensors, const std::vector<std::uint64_t>& sums) {
  std::size_t index = 0;
  for (const auto& [pname, gdims] : tensors) {
    const std::string name = prefix + pname;
    h5_make_parents(file, name);
    H5Handle fspace = h5_space(H5Screate_simple(static_cast<int>(gdims.size()), gdims.data(), nullptr));
    H5Handle dset = h5_dataset(
        H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, fspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!dset.valid()) throw Error::one("'" + where + "': cannot create dataset '" + name + "'");
    if (!sums.empty()) h5_write_attr(dset, "checksum", hex64(sums[index]));  // collective: same value everywhere
    ++index;
    const ParamId id = store.find(pname);
    std::string err;
    if (id >= 0 && owner.owns(store.info(id))) {  // one copy of each tensor
      const ParamInfo& p = store.info(id);
      for_each_block(
          p,
          [&](hid_t mspace, hid_t fsel) {
            if (err.empty() && H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fsel, H5P_DEFAULT, host + p.offset) < 0)
              err = "'" + where + "': writing '" + name + "' failed (disk full?)";
          },
          fspace);
    }
    agree_or_throw(comm, err);
  }
}

void make_dirs(const std::string& d) {
  std::error_code ec;
  fs::create_directories(d, ec);
  TRIDENT_REQUIRE(!ec, "cannot create directory '" << d << "': " << ec.message());
}

// Flushes a file's data, or a directory's entries (a rename in it), to the disk: "" or why not.
std::string sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open '" + path + "' to flush it to the disk: " + std::strerror(errno);
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0)
    return "flushing '" + path + "' to the disk failed: " + std::strerror(e) + (e == ENOSPC ? " (disk full)" : "");
  return "";
}

std::string parent_dir(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

// Writes `text` to path.tmp, flushes it, renames it over `path` and flushes the directory: a
// crash leaves the old file or the new one, whole and on the disk.
void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error::one("cannot write '" + tmp + "'");
  }
  if (const std::string e = sync_to_disk(tmp); !e.empty()) throw Error::one(e);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error::one("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  if (const std::string e = sync_to_disk(parent_dir(path)); !e.empty()) throw Error::one(e);
}

// The root attributes of a checkpoint ("Root attributes"), lora_base and its digest with adapters.
void write_root_attributes(hid_t file, const CheckpointState& st, bool has_optimizer, bool adapters,
                           const std::string& layout) {
  h5_write_attr(file, "checksum_algorithm", std::string(kChecksumAlgorithm));
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
  h5_write_attr(file, "has_optimizer", static_cast<std::int64_t>(has_optimizer ? 1 : 0));
  if (adapters) {
    h5_write_attr(file, "lora_base", st.lora_base);
    h5_write_attr(file, "lora_base_digest", st.lora_base_digest);
  }
  h5_write_attr(file, "parallel_layout", layout);
}

// A range [begin, end) of the flat buffers, whose optimizer state sits from `at` on in
// AdamW::exp_avg() and the others (the flat index i at at + i - begin).
struct FlatRange {
  std::int64_t begin = 0, end = 0, at = 0;
};

// The ranges whose optimizer state this rank holds: its optimizer's segments (all of the buffers
// without one).
std::vector<FlatRange> held_ranges(const ParamStore& store, const AdamW* opt) {
  if (!opt) return {FlatRange{0, store.padded_size(), 0}};
  std::vector<FlatRange> out;
  for (const AdamW::Segment& s : opt->segments()) out.push_back(FlatRange{s.begin, s.begin + s.n, s.at});
  return out;
}

// The ranges whose elements this rank writes and checksums, so that the ranks' ranges partition
// every tensor: the distributed optimizer's shards (of the parameters too: every data-parallel
// rank holds them, so each writes the part its shard covers), and without sharding the ranges of
// data-parallel rank 0 (expert-data-parallel rank 0 for the experts).
std::vector<FlatRange> owned_ranges(const ParamStore& store, const AdamW* opt, const Owner& w) {
  std::vector<FlatRange> out;
  if (!opt) {
    if (w.dense) out.push_back(FlatRange{0, store.expert_begin(), 0});
    if (w.expert && store.has_experts())
      out.push_back(FlatRange{store.expert_begin(), store.padded_size(), store.expert_begin()});
    return out;
  }
  for (const AdamW::Segment& s : opt->segments()) {
    const std::int64_t len = s.expert ? store.padded_size() - store.expert_begin() : store.dense_trainable_size();
    if (s.n < len || (s.expert ? w.expert : w.dense)) out.push_back(FlatRange{s.begin, s.begin + s.n, s.at});
  }
  return out;
}

// Whether this rank writes (a part of) p under the tensor-parallel rule: no tied copies, and a
// tensor replicated over tp (expert tp for experts) from tp rank 0 only.
bool tp_owns(const ParamInfo& p, const Owner& w) {
  if (p.tied_copy) return false;
  return !(p.tp_replicated && (p.expert ? w.etp : w.tp) != 0);
}

// Calls f(range, flat, global, n) for p's runs clipped to `ranges`: n elements from flat index
// `flat` of the buffers on, the global tensor's from `global` on.
template <class F>
void for_each_piece(const ParamInfo& p, const std::vector<TensorRun>& runs, const std::vector<FlatRange>& ranges,
                    F&& f) {
  for (const TensorRun& r : runs) {
    const std::int64_t a = p.offset + r.local, b = a + r.n;
    for (const FlatRange& g : ranges) {
      const std::int64_t lo = std::max(a, g.begin), hi = std::min(b, g.end);
      if (lo < hi) f(g, lo, r.global + (lo - a), hi - lo);
    }
  }
}

// The datasets of a checkpoint in file order: model/..., then each optimizer prefix.
struct DatasetList {
  std::vector<std::string> names;  // full dataset names
  std::vector<std::vector<hsize_t>> dims;
  std::map<std::string, int> index;  // full name -> position
  void add(const std::string& prefix, const std::map<std::string, std::vector<hsize_t>>& tensors) {
    for (const auto& [name, d] : tensors) {
      index[prefix + name] = static_cast<int>(names.size());
      names.push_back(prefix + name);
      dims.push_back(d);
    }
  }
  std::uint64_t numel(int i) const {
    std::uint64_t n = 1;
    for (auto d : dims[static_cast<size_t>(i)]) n *= d;
    return n;
  }
};

// Where the elements of each owned range (FlatRange i) sit, for a save's writes or a load's
// checks: flat index f of range i at values[i] + (f - begin) (the model as fp32), and likewise in
// m, v and master (the optimizer state): the model's and optimizer's own memory, host copies laid
// out like them, or the ranges packed one after another (an asynchronous save's copies).
struct StateBuffers {
  std::vector<const float*> values, m, v, master;  // (ranges) each; m, v, master empty when absent
  const float* states = nullptr;                   // (host_size - padded_size) the model's states
};

// Calls f(dataset, kind, range, element, global, n) for the pieces of a checkpoint's tensors that
// this rank writes (or verifies on load): n elements of dataset `dataset` from global index `global`
// on. kind 0 is the model (prefix ""; `element` a flat index in owned[range], or with range -1 an
// index into the model's states), kinds 1, 2, 3 the optimizer's exp_avg, exp_avg_sq and master
// (the first `moments` of them; `element` a flat index in owned[range]).
template <class F>
void for_each_owned_piece(const ParamStore& store, const DatasetList& ds, const std::vector<FlatRange>& owned,
                          const Owner& w, const std::map<std::string, std::vector<hsize_t>>& model_tensors,
                          const std::map<std::string, std::vector<hsize_t>>& opt_tensors, int moments, F&& f) {
  const std::int64_t N = store.padded_size();
  auto index_of = [&owned](const FlatRange& g) { return static_cast<int>(&g - owned.data()); };
  for (const auto& entry : model_tensors) {
    const ParamId id = store.find(entry.first);
    if (id < 0 || !tp_owns(store.info(id), w)) continue;
    const ParamInfo& p = store.info(id);
    const int d = ds.index.at(entry.first);
    const auto runs = tensor_runs(p);
    if (p.state) {  // outside the flat buffers: data-parallel rank 0's
      if (!w.dense) continue;
      for (const TensorRun& r : runs) f(d, 0, -1, (p.offset - N) + r.local, r.global, r.n);
      continue;
    }
    for_each_piece(p, runs, owned, [&](const FlatRange& g, std::int64_t flat, std::int64_t global, std::int64_t n) {
      f(d, 0, index_of(g), flat, global, n);
    });
  }
  const char* const prefixes[] = {"optimizer/exp_avg/", "optimizer/exp_avg_sq/", "optimizer/master/"};
  for (int k = 0; k < moments; ++k) {
    for (const auto& entry : opt_tensors) {
      const ParamId id = store.find(entry.first);
      if (id < 0 || !tp_owns(store.info(id), w) || store.info(id).state) continue;
      const ParamInfo& p = store.info(id);
      const int d = ds.index.at(prefixes[k] + entry.first);
      for_each_piece(p, tensor_runs(p), owned,
                     [&](const FlatRange& g, std::int64_t flat, std::int64_t global, std::int64_t n) {
                       f(d, k + 1, index_of(g), flat, global, n);
                     });
    }
  }
}

// The pieces of for_each_owned_piece as FileRuns with their sources in `b`.
std::vector<FileRun> owned_pieces(const ParamStore& store, const DatasetList& ds, const StateBuffers& b,
                                  const std::vector<FlatRange>& owned, const Owner& w,
                                  const std::map<std::string, std::vector<hsize_t>>& model_tensors,
                                  const std::map<std::string, std::vector<hsize_t>>& opt_tensors) {
  std::vector<FileRun> out;
  const std::vector<const float*>* moment[] = {&b.m, &b.v, &b.master};
  const int moments = b.m.empty() ? 0 : (b.master.empty() ? 2 : 3);
  for_each_owned_piece(store, ds, owned, w, model_tensors, opt_tensors, moments,
                       [&](int d, int kind, int range, std::int64_t element, std::int64_t global, std::int64_t n) {
                         const float* src = kind == 0
                                                ? (range < 0 ? b.states + element
                                                             : b.values[static_cast<size_t>(range)] +
                                                                   (element - owned[static_cast<size_t>(range)].begin))
                                                : (*moment[kind - 1])[static_cast<size_t>(range)] +
                                                      (element - owned[static_cast<size_t>(range)].begin);
                         out.push_back(FileRun{src, n, global, d});
                       });
  return out;
}

// The elements of `owned` in all (a packed copy's length).
std::int64_t owned_elements(const std::vector<FlatRange>& owned) {
  std::int64_t n = 0;
  for (const FlatRange& g : owned) n += g.end - g.begin;
  return n;
}

// Rank 0 of a save: creates checkpoint.h5.tmp (serial HDF5) with every dataset, contiguous and
// allocated at creation but never filled, and the root attributes; returns the byte offset of
// each dataset's raw data, which the ranks then write with positional writes.
std::vector<std::uint64_t> create_checkpoint_file(const std::string& path, const DatasetList& ds,
                                                  const CheckpointState& st, bool has_optimizer, bool adapters,
                                                  const std::string& layout) {
  H5QuietErrors quiet;
  H5Handle file = h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(file.valid(), "cannot create checkpoint file '" << path << "'");
  H5Handle dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  std::vector<std::uint64_t> offsets(ds.names.size(), 0);
  for (size_t i = 0; i < ds.names.size(); ++i) {
    const std::string& name = ds.names[i];
    h5_make_parents(file, name);
    H5Handle space = h5_space(H5Screate_simple(static_cast<int>(ds.dims[i].size()), ds.dims[i].data(), nullptr));
    H5Handle dset = h5_dataset(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    TRIDENT_REQUIRE(dset.valid(), "'" << path << "': cannot create dataset '" << name << "' (disk full?)");
    const haddr_t at = H5Dget_offset(dset);
    TRIDENT_REQUIRE(at != HADDR_UNDEF || ds.numel(static_cast<int>(i)) == 0,
                    "'" << path << "': no storage was allocated for dataset '" << name << "' (disk full?)");
    offsets[i] = at == HADDR_UNDEF ? 0 : static_cast<std::uint64_t>(at);
  }
  write_root_attributes(file, st, has_optimizer, adapters, layout);
  TRIDENT_REQUIRE(H5Fclose(file.release()) >= 0, "closing checkpoint file '" << path << "' failed (disk full?)");
  return offsets;
}

// Host buffers of `n` floats, without zero-filling them.
HostFloatView host_buffer(const char* label, std::int64_t n) {
  return HostFloatView(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), static_cast<size_t>(n));
}

constexpr bool kHostAccessible = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;

}  // namespace

struct CheckpointSaver::Impl {
  // the save in flight
  bool pending = false, async = false;
  std::string save_dir, dir, tmp_path, final_path;
  std::int64_t iteration = 0;
  DatasetList ds;
  std::vector<FileRun> runs;
  std::vector<std::uint64_t> offsets;
  SaveTimes times;
  double begin_mark = 0;
  // the background writer
  std::thread writer;
  std::atomic<bool> done{false}, stop{false};
  double pause_s = 0;  // debug.checkpoint_write_pause_s
  RunWriteResult result;
  // host copies (kept between saves): the flat model, its states, this rank's optimizer state;
  // the sync path on a host backend reads the model's and optimizer's own memory instead
  HostFloatView values, states, m, v, master;
  void join() {
    if (writer.joinable()) writer.join();
  }
};

CheckpointSaver::CheckpointSaver() : impl_(std::make_unique<Impl>()) {}

CheckpointSaver::~CheckpointSaver() {
  // a save still in flight is abandoned where it is (its .tmp file stays; `latest` names the
  // previous checkpoint): an error is ending the job
  if (!impl_) return;
  impl_->stop = true;
  impl_->join();
}

bool CheckpointSaver::pending() const { return impl_->pending; }
void CheckpointSaver::set_write_pause(double seconds) { impl_->pause_s = seconds; }
const SaveTimes& CheckpointSaver::times() const { return impl_->times; }
std::int64_t CheckpointSaver::iteration() const { return impl_->iteration; }

void CheckpointSaver::reserve(const ParamStore& store, const AdamW* opt, const Topology& topo) {
  Impl& s = *impl_;
  const std::int64_t P = owned_elements(owned_ranges(store, opt, owner_of(topo)));
  // zero-filled: the pages are touched now, at start-up, not during the first save's stall
  auto make = [P](HostFloatView& v, const char* label) {
    if (v.extent(0) != static_cast<size_t>(P)) v = HostFloatView(std::string(label), static_cast<size_t>(P));
  };
  make(s.values, "checkpoint::values");
  if (opt) {
    make(s.m, "checkpoint::exp_avg");
    make(s.v, "checkpoint::exp_avg_sq");
    if (opt->has_master()) make(s.master, "checkpoint::master");
  }
}

std::int64_t CheckpointSaver::host_buffer_bytes(const ParamStore& store, const AdamW* opt, const Topology& topo) {
  const std::int64_t P = owned_elements(owned_ranges(store, opt, owner_of(topo)));
  const std::int64_t n = P * (1 + (opt ? (opt->has_master() ? 3 : 2) : 0)) + store.host_size() - store.padded_size();
  return n * static_cast<std::int64_t>(sizeof(float));
}

void CheckpointSaver::begin(const std::string& save_dir, const CheckpointState& st, const ParamStore& store,
                            const AdamW* opt, const Topology& topo, bool async) {
  Impl& s = *impl_;
  TRIDENT_REQUIRE(!s.pending, "internal: a checkpoint save began while another one is pending");
  const Communicator& world = topo.world();
  s.times = SaveTimes{};
  s.async = async;
  s.begin_mark = wall_seconds();
  double mark = s.begin_mark;
  auto lap = [&mark](double& into) {
    const double now = wall_seconds();
    into += now - mark;
    mark = now;
  };
  s.save_dir = save_dir;
  s.iteration = st.iteration;
  s.dir = save_dir + "/" + iter_dir_name(st.iteration);
  s.final_path = s.dir + "/checkpoint.h5";
  s.tmp_path = s.final_path + ".tmp";
  collectively(world.get(), [&] {
    if (world.rank() == 0) make_dirs(s.dir);
  });
  // 1. the state, where the writes read it: the model's and optimizer's own host memory (a
  // synchronous save on a host backend), or a host copy of the ranges this rank writes, packed
  // (an asynchronous save; a device's memory; 16-bit parameters, widened)
  const Owner w = owner_of(topo);
  const std::vector<FlatRange> owned = owned_ranges(store, opt, w);
  const std::int64_t P = owned_elements(owned);
  const std::int64_t N = store.padded_size();
  StateBuffers b;
  auto stage = [&](HostFloatView& keep, const char* label, const FloatView& from, bool model,
                   std::vector<const float*>& out) {
    out.clear();
    if (!async && kHostAccessible) {
      for (const FlatRange& g : owned) out.push_back(from.data() + (model ? g.begin : g.at));
      return;
    }
    if (keep.extent(0) != static_cast<size_t>(P)) keep = host_buffer(label, P);
    std::int64_t pos = 0;
    for (const FlatRange& g : owned) {
      const std::int64_t at = model ? g.begin : g.at, len = g.end - g.begin;
      Kokkos::deep_copy(slice(keep, pos, len), slice(from, at, len));  // on a host backend a memcpy
      out.push_back(keep.data() + pos);
      pos += len;
    }
  };
  if (store.dtype() == DType::F32) {
    stage(s.values, "checkpoint::values", store.values(), true, b.values);
  } else {
    if (s.values.extent(0) != static_cast<size_t>(P)) s.values = host_buffer("checkpoint::values", P);
    const bool bf16 = store.dtype() == DType::BF16;
    std::int64_t pos = 0;
    for (const FlatRange& g : owned) {
      const std::int64_t len = g.end - g.begin;
      auto h16 = Kokkos::create_mirror_view_and_copy(HostSpace(), slice(store.values16(), g.begin, len));
      float* out = s.values.data() + pos;
      const std::uint16_t* in = h16.data();
      for (std::int64_t i = 0; i < len; ++i) out[i] = bf16 ? bf16_to_float(in[i]) : fp16_to_float(in[i]);
      b.values.push_back(out);
      pos += len;
    }
  }
  if (store.has_states()) {
    const std::int64_t ns = store.host_size() - N;
    if (s.states.extent(0) != static_cast<size_t>(ns)) s.states = host_buffer("checkpoint::states", ns);
    Kokkos::deep_copy(s.states, store.states());
    b.states = s.states.data();
  }
  if (opt) {
    stage(s.m, "checkpoint::exp_avg", opt->exp_avg(), false, b.m);
    stage(s.v, "checkpoint::exp_avg_sq", opt->exp_avg_sq(), false, b.v);
    if (opt->has_master()) stage(s.master, "checkpoint::master", opt->master(), false, b.master);
  }
  lap(s.times.copy);
  // 2. the datasets, and this rank's pieces of them
  const TensorSet set = store.has_adapters() ? TensorSet::adapters : TensorSet::all;
  const auto model_tensors = all_tensors(store, world.get(), set),
             opt_tensors = all_tensors(store, world.get(), set, false);
  s.ds = DatasetList{};
  s.ds.add("", model_tensors);
  if (opt) {
    s.ds.add("optimizer/exp_avg/", opt_tensors);
    s.ds.add("optimizer/exp_avg_sq/", opt_tensors);
    if (opt->has_master()) s.ds.add("optimizer/master/", opt_tensors);
  }
  s.runs = owned_pieces(store, s.ds, b, owned, w, model_tensors, opt_tensors);
  // 3. rank 0 creates the file; every rank learns where each dataset's bytes go
  std::string offsets_text;
  collectively(world.get(), [&] {
    if (world.rank() != 0) return;
    const auto offsets = create_checkpoint_file(s.tmp_path, s.ds, st, opt != nullptr, store.has_adapters(),
                                                "tp=" + std::to_string(topo.tp_size()) +
                                                    " pp=" + std::to_string(topo.pp_size()) +
                                                    " dp=" + std::to_string(topo.dp_size()) +
                                                    (topo.cp_size() > 1 ? " cp=" + std::to_string(topo.cp_size())
                                                                        : std::string()));
    std::ostringstream os;
    for (auto o : offsets) os << o << ' ';
    offsets_text = os.str();
  });
  offsets_text = world.broadcast_text(offsets_text);
  s.offsets.clear();
  {
    std::istringstream in(offsets_text);
    for (std::uint64_t o; in >> o;) s.offsets.push_back(o);
  }
  TRIDENT_REQUIRE(s.offsets.size() == s.ds.names.size(), "internal: checkpoint dataset offsets do not match");
  lap(s.times.create);
  // 4. the writes: here, or on a thread of their own (POSIX writes only: no MPI, no HDF5)
  s.pending = true;
  s.done = false;
  s.result = RunWriteResult{};
  s.stop = false;
  const RunWriteControl control{&s.stop, s.pause_s};
  if (!async) {
    s.result = write_runs(s.tmp_path, s.runs, s.offsets, s.ds.names.size(), control);
    s.done = true;
    return;
  }
  s.writer = std::thread([&s, control] {
    s.result = write_runs(s.tmp_path, s.runs, s.offsets, s.ds.names.size(), control);
    s.done = true;
  });
}

bool CheckpointSaver::ready(const Topology& topo) {
  if (!impl_->pending) return true;
  return topo.world().allreduce_min(static_cast<std::int64_t>(impl_->done.load() ? 1 : 0)) == 1;
}

std::string CheckpointSaver::finish(const Topology& topo) {
  Impl& s = *impl_;
  TRIDENT_REQUIRE(s.pending, "internal: no checkpoint save to finish");
  const Communicator& world = topo.world();
  double mark = wall_seconds();
  s.join();
  s.pending = false;
  struct Release {  // a synchronous save keeps no host copies
    Impl& s;
    ~Release() {
      if (!s.async) s.values = s.states = s.m = s.v = s.master = HostFloatView();
    }
  } release{s};
  s.times.wait = wall_seconds() - mark;
  mark = wall_seconds();
  s.times.checksum = s.result.checksum_s;
  s.times.write = s.result.write_s;
  s.times.fsync = s.result.fsync_s;
  const size_t D = s.ds.names.size();
  // a failed save leaves no .tmp file behind (a full disk gets its room back)
  auto fail = [&](const std::string& why) {
    if (world.rank() == 0) std::remove(s.tmp_path.c_str());
    throw Error::all(why);
  };
  try {
    agree_or_throw(world.get(), s.result.error);
  } catch (const Error& e) {
    fail(e.what());
  }
  // one all-reduce: per dataset the checksum, the elements written and whether one was not finite
  std::vector<std::uint64_t> acc = s.result.packed();  // (3, datasets)
  world.allreduce_sum(acc.data(), static_cast<std::int64_t>(acc.size()));
  for (size_t i = 0; i < D; ++i)
    if (acc[2 * D + i] != 0)  // a diverged run never writes a checkpoint (the earlier ones stay)
      fail("refusing to write the checkpoint of iteration " + std::to_string(s.iteration) +
           " (the run has diverged; earlier checkpoints are kept): tensor '" + s.ds.names[i] +
           "' holds non-finite values (NaN or inf)");
  for (size_t i = 0; i < D; ++i)
    if (acc[D + i] != s.ds.numel(static_cast<int>(i)))
      fail("internal: the ranks wrote " + std::to_string(acc[D + i]) + " of the " +
           std::to_string(s.ds.numel(static_cast<int>(i))) + " elements of checkpoint tensor '" + s.ds.names[i] + "'");
  std::string err;
  if (world.rank() == 0) {
    try {
      H5QuietErrors quiet;
      H5Handle file = h5_file(H5Fopen(s.tmp_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      TRIDENT_REQUIRE(file.valid(), "cannot reopen checkpoint file '" << s.tmp_path << "'");
      for (size_t i = 0; i < D; ++i) {
        H5Handle dset = h5_dataset(H5Dopen2(file, s.ds.names[i].c_str(), H5P_DEFAULT));
        TRIDENT_REQUIRE(dset.valid(), "'" << s.tmp_path << "': cannot reopen dataset '" << s.ds.names[i] << "'");
        h5_write_attr(dset, "checksum", hex64(acc[i]));
      }
      TRIDENT_REQUIRE(H5Fclose(file.release()) >= 0,
                      "closing checkpoint file '" << s.tmp_path << "' failed (disk full?)");
      if (const std::string e = sync_to_disk(s.tmp_path); !e.empty()) throw Error::one(e);
      if (std::rename(s.tmp_path.c_str(), s.final_path.c_str()) != 0)
        throw Error::one("cannot rename '" + s.tmp_path + "': " + std::strerror(errno));
      if (const std::string e = sync_to_disk(s.dir); !e.empty()) throw Error::one(e);
      if (const std::string e = sync_to_disk(s.save_dir); !e.empty()) throw Error::one(e);  // the iter_ directory
      write_text_atomically(s.save_dir + "/latest", std::to_string(s.iteration) + "\n");
      if (const int n = remove_stale_tmp_files(s.save_dir))
        std::printf("removed %d temporary file(s) of earlier checkpoint saves that did not finish\n", n);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  try {
    agree_or_throw(world.get(), err);
  } catch (const Error& e) {
    fail(e.what());
  }
  s.times.publish = wall_seconds() - mark;
  return s.final_path;
}

std::string save_checkpoint(const std::string& save_dir, const CheckpointState& st, const ParamStore& store,
                            const AdamW* opt, const Topology& topo, SaveTimes* times) {
  CheckpointSaver saver;
  saver.begin(save_dir, st, store, opt, topo, false);
  const std::string f = saver.finish(topo);
  if (times) *times = saver.times();
  return f;
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
  TRIDENT_REQUIRE(fs::exists(file, ec),
                  "checkpoint.load: 'latest' names iteration " << it << " but '" << file << "' is missing");
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
                                                            << ", newer than this Trident (" << kCheckpointVersion
                                                            << ")");
  const std::string model = h5_read_attr_string(file, "model", path);
  TRIDENT_REQUIRE(model == expected_model,
                  "checkpoint '" << path << "' holds a " << model << " model, not " << expected_model);
  return file;
}
}  // namespace

std::string checkpoint_model_kind(const std::string& path, MPI_Comm world) {
  std::string model;
  collectively(world, [&] {
    H5QuietErrors quiet;
    TRIDENT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "checkpoint '" << path << "' is not an HDF5 file");
    H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    TRIDENT_REQUIRE(file.valid(), "cannot open checkpoint '" << path << "'");
    const std::string fmt = h5_has_attr(file, "format") ? h5_read_attr_string(file, "format", path) : "";
    TRIDENT_REQUIRE(fmt == kCheckpointFormat, "'" << path << "' is not a Trident checkpoint (format '" << fmt << "')");
    model = h5_read_attr_string(file, "model", path);
  });
  return model;
}

std::vector<std::int64_t> checkpoint_tensor_shape(const std::string& path, const std::string& name) {
  H5QuietErrors quiet;
  H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  TRIDENT_REQUIRE(file.valid(), "cannot open checkpoint '" << path << "'");
  H5Handle d = h5_dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  TRIDENT_REQUIRE(d.valid(), "checkpoint '" << path << "' has no " << name);
  std::vector<std::int64_t> shape;
  for (auto x : h5_dims(d)) shape.push_back(static_cast<std::int64_t>(x));
  return shape;
}

std::string read_checkpoint_deck(const std::string& path, const std::string& expected_model, MPI_Comm world) {
  std::string deck;
  collectively(world, [&] {
    H5QuietErrors quiet;
    H5Handle file = open_checkpoint(path, expected_model);
    deck = h5_read_attr_string(file, "deck", path);
  });
  return deck;
}

namespace {
// One float32 dataset of an open checkpoint. A raw one (contiguous, unfiltered, little-endian
// fp32, its storage allocated: every checkpoint Trident writes) is read from its bytes at
// offset() by read_jobs; any other (a file repacked with chunks or filters) through HDF5 by
// read(), the whole dataset once.
class TensorReader {
 public:
  TensorReader(hid_t file, const std::string& name, const std::string& where) : name_(name), where_(where) {
    dset_ = h5_dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
    TRIDENT_REQUIRE(dset_.valid(),
                    "checkpoint " << where << ": tensor '" << name << "' cannot be opened (the file is corrupt)");
    H5Handle dcpl = h5_plist(H5Dget_create_plist(dset_));
    H5Handle type = h5_type(H5Dget_type(dset_));
    const haddr_t at = H5Dget_offset(dset_);
    raw_ = dcpl.valid() && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 && type.valid() &&
           H5Tequal(type, H5T_IEEE_F32LE) > 0 && at != HADDR_UNDEF;
    offset_ = raw_ ? static_cast<std::uint64_t>(at) : 0;
  }
  std::vector<hsize_t> dims() const { return h5_dims(dset_); }
  bool raw() const { return raw_; }
  std::uint64_t offset() const { return offset_; }
  // (not raw) n elements from global row-major index `global` on, into dst
  void read(std::int64_t global, std::int64_t n, float* dst) {
    if (whole_.empty()) {
      std::size_t total = 1;
      for (auto d : dims()) total *= d;
      whole_.resize(total);
      TRIDENT_REQUIRE(total == 0 || H5Dread(dset_, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, whole_.data()) >= 0,
                      "checkpoint " << where_ << ": reading '" << name_
                                    << "' failed (the file is corrupt or truncated)");
    }
    std::memcpy(dst, whole_.data() + global, static_cast<size_t>(n) * sizeof(float));
  }

 private:
  std::string name_, where_;
  H5Handle dset_;
  bool raw_ = false;
  std::uint64_t offset_ = 0;
  std::vector<float> whole_;
};
}  // namespace

CheckpointState load_checkpoint(const std::string& path, const std::string& expected_model, ParamStore& store,
                                AdamW* opt, const Topology& topo, TensorSet set, LoadTimes* times) {
  CheckpointState st;
  LoadTimes local_times;
  LoadTimes& lt = times ? *times : local_times;
  lt = LoadTimes{};
  double mark = wall_seconds();
  const MPI_Comm world = topo.world().get();
  const auto model_tensors = all_tensors(store, world, set), opt_tensors = all_tensors(store, world, set, false);
  const std::vector<FlatRange> held = held_ranges(store, opt);
  const Owner w = owner_of(topo);
  const std::vector<FlatRange> owned = owned_ranges(store, opt, w);
  std::int64_t version = 0;
  bool has_master = false;
  DatasetList ds;
  std::vector<std::string> want;  // (ds) the stored checksums, with format_version 2
  // The file stays open through the load: the readers of the datasets this rank reads (by
  // position in ds).
  H5QuietErrors quiet;
  H5Handle file;
  std::vector<std::unique_ptr<TensorReader>> readers;
  collectively(world, [&] {
    file = open_checkpoint(path, expected_model);
    version = h5_read_attr_int(file, "format_version", path);
    st.model = expected_model;
    st.iteration = h5_read_attr_int(file, "iteration", path);
    st.consumed_samples = h5_read_attr_int(file, "consumed_samples", path);
    st.optimizer_steps = h5_read_attr_int(file, "optimizer_steps", path);
    st.seed = h5_read_attr_int(file, "seed", path);
    st.loss_scale = h5_read_attr_double(file, "loss_scale", path);
    st.deck = h5_read_attr_string(file, "deck", path);
    // the run's precision: a resumed fp16 run restores its loss scaler only from an fp16 checkpoint
    if (h5_has_attr(file, "dtype")) st.dtype = h5_read_attr_string(file, "dtype", path);
    if (h5_has_attr(file, "lora_base")) {
      st.lora_base = h5_read_attr_string(file, "lora_base", path);
      st.lora_base_digest = h5_read_attr_string(file, "lora_base_digest", path);
    }
    // a LoRA checkpoint holds adapters only: never a base model, nor the model of a plain run
    TRIDENT_REQUIRE(st.lora_base.empty() || set == TensorSet::adapters,
                    "checkpoint " << path << " holds LoRA adapters only (trained on " << st.lora_base
                                  << "): load it with the same lora.* keys, or merge it into plain weights first "
                                     "(convert_checkpoint --to merged)");
    TRIDENT_REQUIRE(set != TensorSet::adapters || !st.lora_base.empty(),
                    "checkpoint " << path
                                  << " holds no LoRA adapters (it is not a checkpoint of a run with lora.rank > 0)");
    if (opt)
      TRIDENT_REQUIRE(h5_read_attr_int(file, "has_optimizer", path) == 1,
                      "checkpoint '" << path << "' has no optimizer state to resume from");
    // fp32 master weights of a 16-bit run; without them (a checkpoint of an fp32 run) the masters
    // start from the model's values
    has_master = opt && opt->has_master() && H5Lexists(file, "optimizer/master", H5P_DEFAULT) > 0;
    if (h5_has_attr(file, "loss_scale_growth_tracker")) {
      st.loss_scale_growth_tracker = h5_read_attr_int(file, "loss_scale_growth_tracker", path);
      st.loss_scale_hysteresis_tracker = h5_read_attr_int(file, "loss_scale_hysteresis_tracker", path);
      st.skipped_iterations = h5_read_attr_int(file, "skipped_iterations", path);
    }
    ds.add("", model_tensors);
    if (opt) {
      ds.add("optimizer/exp_avg/", opt_tensors);
      ds.add("optimizer/exp_avg_sq/", opt_tensors);
      if (has_master) ds.add("optimizer/master/", opt_tensors);
    }
    // every dataset exists (and carries its checksum); the ones of this rank's tensors have their shapes
    for (const std::string& name : ds.names) {
      TRIDENT_REQUIRE(H5Lexists(file, name.substr(0, name.find('/')).c_str(), H5P_DEFAULT) > 0 &&
                          H5Oexists_by_name(file, name.c_str(), H5P_DEFAULT) > 0,
                      "checkpoint " << path << " has no tensor '" << name
                                    << "' (not a checkpoint of this model, or the file is corrupt)");
      if (version < 2) continue;
      H5Handle dset = h5_dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
      TRIDENT_REQUIRE(h5_has_attr(dset, "checksum"), "checkpoint " << path << ": tensor '" << name
                                                                   << "' has no checksum attribute (format_version "
                                                                   << version << " requires one)");
      want.push_back(h5_read_attr_string(dset, "checksum", path + ": " + name));
    }
    readers.resize(ds.names.size());
    const char* const prefixes[] = {"", "optimizer/exp_avg/", "optimizer/exp_avg_sq/", "optimizer/master/"};
    for (const auto& p : store.params()) {
      if (!in_set(p, set)) continue;
      for (const char* prefix : prefixes) {
        const auto it = ds.index.find(prefix + p.name);
        if (it == ds.index.end() || (p.state && *prefix)) continue;
        auto r = std::make_unique<TensorReader>(file, ds.names[static_cast<size_t>(it->second)], path);
        std::vector<hsize_t> need(p.global_shape.begin(), p.global_shape.end());  // (ndims)
        TRIDENT_REQUIRE(r->dims() == need, "checkpoint " << path << ": tensor '" << ds.names[it->second]
                                                         << "' has shape " << shape_str(r->dims())
                                                         << " but this model needs " << shape_str(need));
        readers[static_cast<size_t>(it->second)] = std::move(r);
      }
    }
  });
  lt.open = wall_seconds() - mark;
  mark = wall_seconds();
  // One pass over the file: every rank reads all that it holds (its whole local model, its
  // segments of the optimizer state) into place: straight into the model's and optimizer's own
  // memory (fp32 on a host backend), or into host buffers that are converted (16-bit parameters)
  // and copied (a device) once verified. The raw datasets' bytes go through read_jobs (O_DIRECT
  // where the file system allows it), the others through HDF5.
  const std::int64_t N = store.padded_size();
  const bool direct = kHostAccessible && store.dtype() == DType::F32;
  const std::int64_t L = opt ? static_cast<std::int64_t>(opt->exp_avg().extent(0)) : 0;
  HostFloatView values, m, v, master;  // the buffers of the buffered path: (host_size), (L) each
  HostFloatView states;                // (host_size - N) the states, on either path
  float *vbase = nullptr, *mbase = nullptr, *sbase = nullptr, *xbase = nullptr;  // flat / segment-indexed
  bool all_raw = true;                                                           // every read went through read_jobs
  std::optional<RunChecksums> sums;                                              // of the parts this rank owns
  auto dataset = [&](const char* prefix, const ParamInfo& p) -> TensorReader& {
    return *readers.at(static_cast<size_t>(ds.index.at(prefix + p.name)));
  };
  collectively(world, [&] {
    if (direct) {
      vbase = store.values().data();
      if (opt) {
        mbase = opt->exp_avg().data();
        sbase = opt->exp_avg_sq().data();
        if (opt->has_master()) xbase = opt->master().data();
      }
    } else {
      // reading a part of the tensors: the others keep their values
      values = set == TensorSet::all
                   ? HostFloatView(std::string("checkpoint::values"), static_cast<size_t>(store.host_size()))
                   : store.model_to_host();
      vbase = values.data();
      if (opt) {
        m = HostFloatView(std::string("checkpoint::exp_avg"), static_cast<size_t>(L));
        v = HostFloatView(std::string("checkpoint::exp_avg_sq"), static_cast<size_t>(L));
        mbase = m.data();
        sbase = v.data();
        if (opt->has_master()) {
          master = HostFloatView(std::string("checkpoint::master"), static_cast<size_t>(L));
          xbase = master.data();
        }
      }
    }
    if (store.has_states()) states = Kokkos::create_mirror_view_and_copy(HostSpace(), store.states());
    std::vector<ReadJob> jobs;
    auto fetch = [&](TensorReader& r, std::int64_t global, std::int64_t n, float* dst) {
      if (r.raw()) {
        jobs.push_back(ReadJob{r.offset() + static_cast<std::uint64_t>(global) * sizeof(float),
                               static_cast<std::uint64_t>(n) * sizeof(float), reinterpret_cast<char*>(dst)});
      } else {
        r.read(global, n, dst);
        all_raw = false;
      }
    };
    for (const auto& p : store.params()) {
      if (!in_set(p, set)) continue;
      TensorReader& r = dataset("", p);
      const auto runs = tensor_runs(p);
      for (const TensorRun& run : runs) {
        float* dst = p.state ? states.data() + (p.offset - N) + run.local : vbase + p.offset + run.local;
        fetch(r, run.global, run.n, dst);
      }
      if (!opt || p.state) continue;
      auto segments = [&](TensorReader& from, float* base) {
        for_each_piece(p, runs, held, [&](const FlatRange& g, std::int64_t flat, std::int64_t global, std::int64_t n) {
          fetch(from, global, n, base + g.at + (flat - g.begin));
        });
      };
      segments(dataset("optimizer/exp_avg/", p), mbase);
      segments(dataset("optimizer/exp_avg_sq/", p), sbase);
      // the masters: the checkpoint's, or (an fp32 checkpoint) the exact fp32 values of its model
      if (xbase) segments(has_master ? dataset("optimizer/master/", p) : r, xbase);
    }
    // Verification, before a value reaches a device or a 16-bit model: every rank checksums the
    // parts it owns (they partition every tensor, as when saving; it holds them all), checks that
    // every value is finite and counts them, from the memory just read: as read_jobs places each
    // read (behind the disk), or afterwards where HDF5 read some of them.
    StateBuffers b;
    for (const FlatRange& g : owned) {
      b.values.push_back(vbase + g.begin);
      if (!opt) continue;
      b.m.push_back(mbase + g.at);
      b.v.push_back(sbase + g.at);
      if (has_master) b.master.push_back(xbase + g.at);
    }
    b.states = store.has_states() ? states.data() : nullptr;
    sums.emplace(owned_pieces(store, ds, b, owned, w, model_tensors, opt_tensors), ds.names.size());
    RunChecksums& c = *sums;
    const ReadJobsResult got = read_jobs(path, std::move(jobs),
                                         all_raw ? PlacedFn([&c](const char* p, std::uint64_t n) { c.add(p, n); })
                                                 : PlacedFn());
    TRIDENT_REQUIRE(got.error.empty(), "checkpoint " << path << ": reading its tensors failed: " << got.error
                                                     << " (the file is corrupt or truncated)");
  });
  lt.read = wall_seconds() - mark;
  mark = wall_seconds();
  // one all-reduce of the checksums, and every rank reaches the same verdict
  {
    const size_t D = ds.names.size();
    if (!all_raw) sums->add_all();
    std::vector<std::uint64_t> acc = sums->packed();  // (3, datasets): checksum, elements, non-finite
    topo.world().allreduce_sum(acc.data(), static_cast<std::int64_t>(acc.size()));
    std::string bad;
    if (version >= 2) {
      for (size_t i = 0; i < D && bad.empty(); ++i)
        if (hex64(acc[i]) != want[i])
          bad = "checkpoint " + path + " is corrupt: tensor '" + ds.names[i] + "' fails its checksum (stored " +
                want[i] + ", computed " + hex64(acc[i]) + ")";
    } else if (topo.world().rank() == 0) {
      std::printf("checkpoint %s has format_version %lld: no checksums to verify\n", path.c_str(),
                  static_cast<long long>(version));
    }
    for (size_t i = 0; i < D && bad.empty(); ++i)
      if (acc[2 * D + i] != 0)
        bad = "checkpoint " + path + " was written by a diverged run: tensor '" + ds.names[i] +
              "' holds non-finite values (NaN or inf)";
    for (size_t i = 0; i < D && bad.empty(); ++i)
      if (acc[D + i] != ds.numel(static_cast<int>(i)))
        bad = "internal: the ranks hold " + std::to_string(acc[D + i]) + " of the " +
              std::to_string(ds.numel(static_cast<int>(i))) + " elements of checkpoint tensor '" + ds.names[i] + "'";
    agree_or_throw(world, bad);
  }
  lt.verify = wall_seconds() - mark;
  mark = wall_seconds();
  if (store.has_states()) Kokkos::deep_copy(store.states(), states);
  if (!direct) {
    store.model_from_host(values);
    if (opt) {
      Kokkos::deep_copy(opt->exp_avg(), m);
      Kokkos::deep_copy(opt->exp_avg_sq(), v);
      if (opt->has_master()) Kokkos::deep_copy(opt->master(), master);
    }
  }
  if (opt) opt->set_steps(st.optimizer_steps);
  lt.place = wall_seconds() - mark;
  return st;
}

std::string checkpoint_lora_base(const std::string& path, MPI_Comm world) {
  std::string base;
  collectively(world, [&] {
    H5QuietErrors quiet;
    H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    TRIDENT_REQUIRE(file.valid(), "cannot open checkpoint '" << path << "'");
    if (h5_has_attr(file, "lora_base")) base = h5_read_attr_string(file, "lora_base", path);
  });
  return base;
}

std::string checkpoint_digest(const std::string& path, MPI_Comm world) {
  std::string digest;
  collectively(world, [&] {
    H5QuietErrors quiet;
    H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    TRIDENT_REQUIRE(file.valid(), "cannot open checkpoint '" << path << "'");
    TRIDENT_REQUIRE(H5Lexists(file, "model", H5P_DEFAULT) > 0, "checkpoint '" << path << "' has no model/ group");
    struct Visit {
      std::map<std::string, std::string> sums;  // dataset name -> stored checksum (sorted)
      std::string where;
    } visit;
    visit.where = path;
    // (an HDF5 callback: no exception may leave it)
    auto cb = [](hid_t group, const char* name, const H5L_info_t*, void* data) noexcept -> herr_t {
      auto* v = static_cast<Visit*>(data);
      try {
        H5Handle o(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
        if (!o.valid()) return -1;
        if (H5Iget_type(o) != H5I_DATASET) return 0;
        H5Handle d = h5_dataset(H5Dopen2(group, name, H5P_DEFAULT));
        v->sums[name] = d.valid() && h5_has_attr(d, "checksum") ? h5_read_attr_string(d, "checksum", v->where) : "-";
        return 0;
      } catch (...) {
        return -1;
      }
    };
    H5Handle model = h5_group(H5Gopen2(file, "model", H5P_DEFAULT));
    TRIDENT_REQUIRE(model.valid() && H5Lvisit(model, H5_INDEX_NAME, H5_ITER_INC, cb, &visit) >= 0,
                    "checkpoint '" << path << "': cannot list its model tensors");
    std::uint64_t h = 0x9e3779b97f4a7c15ull;
    for (const auto& [name, sum] : visit.sums)
      for (const char c : name + "=" + sum + ";") h = splitmix64(h ^ static_cast<unsigned char>(c));
    digest = hex64(h) + "/" + std::to_string(visit.sums.size());
  });
  return digest;
}

std::vector<std::string> checkpoints_newest_first(const std::string& save) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(save, ec)) return {};
  for (const auto& e : fs::directory_iterator(save, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 12 || name.rfind("iter_", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    const std::string file = (e.path() / "checkpoint.h5").string();
    if (fs::is_regular_file(file, ec)) found.emplace_back(std::stoll(name.substr(5)), file);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::int64_t checkpoint_iteration_of(const std::string& file) {
  const std::string dir = fs::path(file).parent_path().filename().string();
  if (dir.size() != 12 || dir.rfind("iter_", 0) != 0 || dir.find_first_not_of("0123456789", 5) != std::string::npos)
    return -1;
  return std::stoll(dir.substr(5));
}

int remove_stale_tmp_files(const std::string& save) {
  int removed = 0;
  std::error_code ec;
  auto drop = [&](const fs::path& p) {
    if (fs::is_regular_file(p, ec) && fs::remove(p, ec)) ++removed;
  };
  drop(fs::path(save) / "latest.tmp");
  if (!fs::is_directory(save, ec)) return removed;
  for (const auto& e : fs::directory_iterator(save, ec)) {
    if (e.path().filename().string().rfind("iter_", 0) != 0) continue;
    drop(e.path() / "checkpoint.h5.tmp");
    // an iter_* directory a failed save left empty
    if (fs::is_directory(e.path(), ec) && fs::is_empty(e.path(), ec) && fs::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

namespace {
// Rows of a tensor per part of CheckpointFileWriter / Reader: about 2^24 values, at least one row.
constexpr std::int64_t kPartValues = 1 << 24;
std::int64_t rows_per_part(const std::vector<std::int64_t>& shape) {
  std::int64_t inner = 1;
  for (size_t d = 1; d < shape.size(); ++d) inner *= shape[d];
  return std::max<std::int64_t>(1, kPartValues / std::max<std::int64_t>(1, inner));
}
std::int64_t inner_size(const std::vector<std::int64_t>& shape) {
  std::int64_t inner = 1;
  for (size_t d = 1; d < shape.size(); ++d) inner *= shape[d];
  return inner;
}
// The checksum terms of rows [row0, row0 + rows) of a tensor whose rows hold `inner` values.
std::uint64_t part_checksum(const float* v, std::int64_t row0, std::int64_t rows, std::int64_t inner) {
  std::uint64_t sum = 0;
  const std::uint64_t first = static_cast<std::uint64_t>(row0 * inner);
  for (std::int64_t i = 0; i < rows * inner; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, v + i, sizeof bits);
    sum += splitmix64((first + static_cast<std::uint64_t>(i)) * 0x9e3779b97f4a7c15ULL + bits);
  }
  return sum;
}
// The file space of a tensor with its first-dimension rows [row0, row0 + rows) selected, and the
// matching memory space.
std::pair<H5Handle, H5Handle> row_selection(hid_t dset, const std::vector<std::int64_t>& shape, std::int64_t row0,
                                            std::int64_t rows) {
  H5Handle fspace = h5_space(H5Dget_space(dset));
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  if (!shape.empty()) {
    start[0] = static_cast<hsize_t>(row0);
    count[0] = static_cast<hsize_t>(rows);
  }
  if (!shape.empty()) H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  H5Handle mspace = h5_space(shape.empty() ? H5Screate(H5S_SCALAR)
                                           : H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  return {std::move(fspace), std::move(mspace)};
}
}  // namespace

struct CheckpointFileWriter::Impl {
  std::string save_dir, dir, final_path, tmp_path;
  CheckpointState st;
  H5Handle file;
  bool committed = false;
};

CheckpointFileWriter::CheckpointFileWriter(const std::string& save_dir, const CheckpointState& state)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.save_dir = save_dir;
  m.st = state;
  m.dir = save_dir + "/" + iter_dir_name(state.iteration);
  m.final_path = m.dir + "/checkpoint.h5";
  m.tmp_path = m.final_path + ".tmp";
  make_dirs(m.dir);
  H5QuietErrors quiet;
  m.file = h5_file(H5Fcreate(m.tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(m.file.valid(), "cannot create checkpoint file '" << m.tmp_path << "'");
}

CheckpointFileWriter::~CheckpointFileWriter() {
  if (!impl_ || impl_->committed) return;
  impl_->file.reset();
  std::remove(impl_->tmp_path.c_str());
}

void CheckpointFileWriter::write(const std::string& name, const std::vector<std::int64_t>& shape, const Fill& fill) {
  Impl& m = *impl_;
  H5QuietErrors quiet;
  const std::string where = "checkpoint '" + m.tmp_path + "', tensor '" + name + "'";
  TRIDENT_REQUIRE(m.file.valid() && !m.committed, where << ": the file is closed");
  TRIDENT_REQUIRE(H5Lexists(m.file, name.substr(0, name.find('/')).c_str(), H5P_DEFAULT) <= 0 ||
                      H5Oexists_by_name(m.file, name.c_str(), H5P_DEFAULT) <= 0,
                  where << ": written twice");
  h5_make_parents(m.file, name);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space = h5_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  H5Handle dset = h5_dataset(
      H5Dcreate2(m.file, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  TRIDENT_REQUIRE(dset.valid(), where << ": cannot create the dataset");
  const std::int64_t rows = shape.empty() ? 1 : shape[0], inner = inner_size(shape), per = rows_per_part(shape);
  std::vector<float> part(static_cast<size_t>(std::min(rows, per) * inner));
  std::uint64_t sum = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += per) {
    const std::int64_t n = std::min(per, rows - r0);
    fill(r0, n, part.data());
    for (std::int64_t i = 0; i < n * inner; ++i)
      TRIDENT_REQUIRE(std::isfinite(part[static_cast<size_t>(i)]),
                      where << ": element " << r0 * inner + i << " is " << part[static_cast<size_t>(i)]);
    sum += part_checksum(part.data(), r0, n, inner);
    auto [fspace, mspace] = row_selection(dset, shape, r0, n);
    TRIDENT_REQUIRE(H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, part.data()) >= 0,
                    where << ": writing rows " << r0 << ".." << r0 + n << " failed (disk full?)");
  }
  h5_write_attr(dset, "checksum", hex64(sum));
}

std::string CheckpointFileWriter::commit() {
  Impl& m = *impl_;
  TRIDENT_REQUIRE(m.file.valid() && !m.committed, "checkpoint '" << m.tmp_path << "': committed twice");
  {
    H5QuietErrors quiet;
    write_root_attributes(m.file, m.st, false, false, "tp=1 pp=1 dp=1");
    TRIDENT_REQUIRE(H5Fclose(m.file.release()) >= 0, "closing checkpoint file '" << m.tmp_path << "' failed");
  }
  if (const std::string e = sync_to_disk(m.tmp_path); !e.empty()) throw Error::one(e);
  TRIDENT_REQUIRE(std::rename(m.tmp_path.c_str(), m.final_path.c_str()) == 0,
                  "cannot rename '" << m.tmp_path << "': " << std::strerror(errno));
  if (const std::string e = sync_to_disk(parent_dir(m.final_path)); !e.empty()) throw Error::one(e);
  m.committed = true;
  write_text_atomically(m.save_dir + "/latest", std::to_string(m.st.iteration) + "\n");
  return m.final_path;
}

struct CheckpointFileReader::Impl {
  std::string path;
  H5Handle file;
  std::int64_t version = 0;
};

CheckpointFileReader::CheckpointFileReader(const std::string& file, const std::string& expected_model)
    : impl_(std::make_unique<Impl>()) {
  H5QuietErrors quiet;
  impl_->path = file;
  TRIDENT_REQUIRE(H5Fis_hdf5(file.c_str()) > 0, "checkpoint '" << file << "' is not an HDF5 file");
  impl_->file = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  TRIDENT_REQUIRE(impl_->file.valid(), "cannot open checkpoint '" << file << "'");
  const std::string fmt = h5_has_attr(impl_->file, "format") ? h5_read_attr_string(impl_->file, "format", file) : "";
  TRIDENT_REQUIRE(fmt == kCheckpointFormat, "'" << file << "' is not a Trident checkpoint (format '" << fmt << "')");
  impl_->version = h5_read_attr_int(impl_->file, "format_version", file);
  TRIDENT_REQUIRE(impl_->version <= kCheckpointVersion,
                  "checkpoint '" << file << "' has format_version " << impl_->version << ", newer than this Trident ("
                                 << kCheckpointVersion << ")");
  TRIDENT_REQUIRE(expected_model.empty() || model() == expected_model,
                  "checkpoint '" << file << "' holds a " << model() << " model, not " << expected_model);
}

CheckpointFileReader::~CheckpointFileReader() = default;

const std::string& CheckpointFileReader::path() const { return impl_->path; }
std::string CheckpointFileReader::model() const { return h5_read_attr_string(impl_->file, "model", impl_->path); }
std::string CheckpointFileReader::deck() const { return h5_read_attr_string(impl_->file, "deck", impl_->path); }
std::int64_t CheckpointFileReader::iteration() const { return h5_read_attr_int(impl_->file, "iteration", impl_->path); }
std::string CheckpointFileReader::dtype() const { return h5_read_attr_string(impl_->file, "dtype", impl_->path); }

std::string CheckpointFileReader::attribute(const std::string& name) const {
  return h5_has_attr(impl_->file, name) ? h5_read_attr_string(impl_->file, name, impl_->path) : std::string();
}

std::int64_t CheckpointFileReader::int_attribute(const std::string& name) const {
  return h5_read_attr_int(impl_->file, name, impl_->path);
}

std::vector<std::string> CheckpointFileReader::tensors(const std::string& prefix) const {
  std::vector<std::string> out;
  auto visit = [](hid_t, const char* name, const H5O_info_t* oi, void* data) -> herr_t {
    if (oi->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  H5QuietErrors quiet;
  TRIDENT_REQUIRE(H5Ovisit(impl_->file, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &out) >= 0,
                  "checkpoint '" << impl_->path << "': cannot list its tensors (the file is corrupt)");
  std::vector<std::string> kept;
  for (auto& n : out)
    if (n.compare(0, prefix.size(), prefix) == 0) kept.push_back(std::move(n));
  std::sort(kept.begin(), kept.end());
  return kept;
}

bool CheckpointFileReader::has(const std::string& name) const {
  H5QuietErrors quiet;
  return H5Lexists(impl_->file, name.substr(0, name.find('/')).c_str(), H5P_DEFAULT) > 0 &&
         H5Oexists_by_name(impl_->file, name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::int64_t> CheckpointFileReader::shape(const std::string& name) const {
  TRIDENT_REQUIRE(has(name), "checkpoint '" << impl_->path << "' has no tensor '" << name << "'");
  H5QuietErrors quiet;
  H5Handle d = h5_dataset(H5Dopen2(impl_->file, name.c_str(), H5P_DEFAULT));
  TRIDENT_REQUIRE(d.valid(), "checkpoint '" << impl_->path << "': tensor '" << name << "' cannot be opened");
  std::vector<std::int64_t> out;
  for (auto x : h5_dims(d)) out.push_back(static_cast<std::int64_t>(x));
  return out;
}

void CheckpointFileReader::read(const std::string& name, const Visit& f) const {
  const std::vector<std::int64_t> shape = this->shape(name);
  const std::string where = "checkpoint '" + impl_->path + "', tensor '" + name + "'";
  H5QuietErrors quiet;
  H5Handle dset = h5_dataset(H5Dopen2(impl_->file, name.c_str(), H5P_DEFAULT));
  const std::int64_t rows = shape.empty() ? 1 : shape[0], inner = inner_size(shape), per = rows_per_part(shape);
  std::vector<float> part(static_cast<size_t>(std::min(rows, per) * inner));
  std::uint64_t sum = 0;
  for (std::int64_t r0 = 0; r0 < rows; r0 += per) {
    const std::int64_t n = std::min(per, rows - r0);
    auto [fspace, mspace] = row_selection(dset, shape, r0, n);
    TRIDENT_REQUIRE(H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, part.data()) >= 0,
                    where << ": reading rows " << r0 << ".." << r0 + n << " failed (the file is corrupt or truncated)");
    for (std::int64_t i = 0; i < n * inner; ++i)
      TRIDENT_REQUIRE(std::isfinite(part[static_cast<size_t>(i)]),
                      where << " holds non-finite values (NaN or inf) at element " << r0 * inner + i);
    sum += part_checksum(part.data(), r0, n, inner);
    f(r0, n, part.data());
  }
  if (impl_->version >= 2) {
    TRIDENT_REQUIRE(h5_has_attr(dset, "checksum"), where << " has no checksum (the file is corrupt)");
    const std::string want = h5_read_attr_string(dset, "checksum", where);
    TRIDENT_REQUIRE(want == hex64(sum), where << ": checksum " << hex64(sum) << " differs from the stored " << want
                                              << " (the file is corrupt)");
  }
}

std::vector<float> CheckpointFileReader::read_all(const std::string& name) const {
  const auto shape = this->shape(name);
  const std::int64_t inner = inner_size(shape);
  std::int64_t n = inner * (shape.empty() ? 1 : shape[0]);
  std::vector<float> out(static_cast<size_t>(n));
  read(name, [&](std::int64_t r0, std::int64_t rows, const float* v) {
    std::memcpy(out.data() + r0 * inner, v, static_cast<size_t>(rows * inner) * sizeof(float));
  });
  return out;
}

void save_named_tensors(const std::string& path, const std::string& prefix, const ParamStore& store,
                        const FloatView& buffer, std::int64_t iteration, const Topology& topo) {
  auto host = Kokkos::create_mirror_view_and_copy(HostSpace(), buffer);
  std::string err;
  H5CollectiveScope collective;  // a write failing on some ranks ends the job, not hangs it
  H5QuietErrors quiet;
  H5Handle file = open_parallel_create(path, topo.world().get());
  if (!file.valid()) err = "cannot create '" + path + "'";
  agree_or_throw(topo.world().get(), err);
  // the states only from a buffer that holds them (a model_to_host copy; not gradients)
  const bool states = static_cast<std::int64_t>(buffer.extent(0)) >= store.host_size();
  write_tensors(file, topo.world().get(), path, prefix, store, host.data(), owner_of(topo),
                all_tensors(store, topo.world().get(), TensorSet::all, states), {});
  h5_write_attr(file, "iteration", iteration);
}

}  // namespace trident
