// The raw-data path of checkpoints (docs/DESIGN.md "Checkpoints", "Write path"): a rank's part of
// a global tensor as runs of consecutive elements, their checksums, and the positional writes and
// reads that move them between host memory and the bytes of a contiguous HDF5 dataset. Nothing
// here calls MPI or HDF5, so a background thread may run it while training goes on.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "layers/param_store.hpp"

namespace trident {

// n consecutive elements: from `local` on in the rank's tensor (row-major, ParamInfo::shape) and
// from `global` on in the global tensor (row-major, ParamInfo::global_shape).
struct TensorRun {
  std::int64_t local = 0, global = 0, n = 0;
};

// Every element of p's local tensor that maps onto the global tensor (its row blocks, without
// the padding beyond ParamInfo::valid), as runs ordered by `local`; neighbouring runs that are
// consecutive in both tensors are merged (a tensor split by rows is one run per row block).
std::vector<TensorRun> tensor_runs(const ParamInfo& p);

// The checkpoint checksum's terms (format_version 2) of n elements whose global row-major indices
// are global0, global0 + 1, ...: the sum mod 2^64 of splitmix64(index * K + fp32 bits). Sets
// *finite to false when one of them is NaN or infinite (and leaves it alone otherwise).
std::uint64_t checksum_terms(const float* x, std::uint64_t global0, std::int64_t n, bool* finite);

// splitmix64, the checksum's mixing function.
std::uint64_t checksum_mix(std::uint64_t x);

// One run of a save: n floats from host memory `src` to the dataset `dataset` of the file (its
// raw data is fp32, little-endian, contiguous); `global` is the index of the run's first element
// in that dataset.
struct FileRun {
  const float* src = nullptr;
  std::int64_t n = 0, global = 0;
  int dataset = 0;
};

// Per dataset: the checkpoint checksum of some of its elements, how many, and whether one was not
// finite, as a save writes them or a load reads them; packed() lays them out as (3, datasets)
// for the one all-reduce that sums them over the ranks.
struct DatasetSums {
  std::vector<std::uint64_t> sums, elements;  // (datasets)
  std::vector<std::uint8_t> nonfinite;        // (datasets) 1: a value NaN or inf
  DatasetSums() = default;
  explicit DatasetSums(std::size_t datasets) : sums(datasets, 0), elements(datasets, 0), nonfinite(datasets, 0) {}
  // the terms of n elements at x whose global indices in `dataset` start at global0
  void take(int dataset, const float* x, std::uint64_t global0, std::int64_t n);
  std::vector<std::uint64_t> packed() const;
};

// What one rank's writes gave: per dataset, the partial checksum, whether a value was not finite
// and how many elements were written; the first error ("" when none); and where the time went.
struct RunWriteResult : DatasetSums {
  std::string error;
  double checksum_s = 0, write_s = 0, fsync_s = 0;
  bool direct = false;             // the file opened with O_DIRECT
  std::uint64_t direct_bytes = 0;  // the bytes written with it (whole aligned blocks)
};

// How write_runs may be stopped or slowed: `stop` set (by another thread) ends it at its next
// part with an error; `pause_s` > 0 sleeps that long once half of the runs are written (the
// fault suite's window into a background write: deck key debug.checkpoint_write_pause_s).
struct RunWriteControl {
  const std::atomic<bool>* stop = nullptr;
  double pause_s = 0;
};

// Writes `runs` into the existing file `path` (opened for writing, never created or truncated) at
// dataset_offsets[run.dataset] + 4 * run.global, checksumming each part of about 8 MiB just before
// it is written, then flushes the file to the disk (fsync). `datasets` sizes the per-dataset
// vectors. Errors (a full disk) are returned, never thrown.
RunWriteResult write_runs(const std::string& path, const std::vector<FileRun>& runs,
                          const std::vector<std::uint64_t>& dataset_offsets, std::size_t datasets,
                          const RunWriteControl& control = {});

// The checksums (format_version 2 terms), element counts and finiteness, per dataset, of a set of
// FileRuns (the pieces a rank owns on loading), accumulated piecewise as the memory they name is
// filled: add(p, bytes) takes the terms of every run's elements inside [p, p + bytes) (a range
// starting and ending on element boundaries of the runs it meets). The runs must not overlap in
// memory; sums mod 2^64 do not depend on the order of the adds.
class RunChecksums : public DatasetSums {
 public:
  RunChecksums(std::vector<FileRun> runs, std::size_t datasets);
  void add(const char* begin, std::uint64_t bytes);
  // the terms of every run in full (where the memory was filled other than by add's caller)
  void add_all();

 private:
  std::vector<FileRun> runs_;  // ordered by src
};

// One read of a load: `bytes` bytes from byte `offset` of the file into dst (host memory).
struct ReadJob {
  std::uint64_t offset = 0, bytes = 0;
  char* dst = nullptr;
};

// What read_jobs did: the first error ("" when none); the bytes read from the disk with O_DIRECT
// (into its aligned buffers, then copied) and through the page cache; whether O_DIRECT was open.
struct ReadJobsResult {
  std::string error;
  std::uint64_t direct_bytes = 0, cached_bytes = 0;
  bool direct = false;
};

// Reads every job of a load from the file `path` (docs/DESIGN.md "Read path"). The jobs, ordered
// by offset, are gathered into windows of up to 16 MiB aligned to 4 KiB; a window whose jobs fill
// at least a quarter of it is read with O_DIRECT (no page cache) into one of four reused buffers
// by two reader threads while this thread copies the previous windows' bytes into place; sparser
// windows (strided slices of a few KiB) are read job by job through the page cache. Where the
// file system refuses O_DIRECT (tmpfs before Linux 6.6) every window goes through the page
// cache. Jobs may overlap in the file; their destinations must not. `placed`, when given, is called
// on this thread with each job's destination bytes (a job longer than a window in pieces) once
// they are in place, while the readers read on: a load checksums what it owns there, from memory
// still in cache and hidden behind the disk. Errors are returned, never thrown; nothing here calls
// MPI or HDF5.
using PlacedFn = std::function<void(const char* dst, std::uint64_t bytes)>;
ReadJobsResult read_jobs(const std::string& path, std::vector<ReadJob> jobs, const PlacedFn& placed = {});

}  // namespace trident
