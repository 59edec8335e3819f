// HDF5 checkpoints (docs/DESIGN.md "Checkpoints"):
//   <save>/iter_0000100/checkpoint.h5 and <save>/latest (the iteration as text), both written
//   under a temporary name and renamed, so an interrupted save never damages the previous one.
// Tensors are stored GLOBAL (one contiguous float32 dataset each), so a checkpoint loads under any
// parallel layout: every rank writes the part it owns straight into the dataset's bytes and reads
// its slices from them (CheckpointSaver). Model tensors under model/..., AdamW moments under
// optimizer/exp_avg/<name> and optimizer/exp_avg_sq/<name>, and with 16-bit parameters the fp32
// master weights under optimizer/master/<name> (model/<name> then holds the 16-bit values,
// widened to fp32). The distributed optimizer's shards are written by their own ranks and read
// back into whatever shards the loading run has, so a checkpoint loads under any dp and either
// optimizer, and no rank ever holds more than its own shard.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/topology.hpp"
#include "layers/param_store.hpp"
#include "optim/adamw.hpp"

namespace trident {

inline constexpr const char* kCheckpointFormat = "trident.checkpoint";
// 2: every dataset carries a `checksum` attribute, verified on load (1: none; still loaded)
inline constexpr std::int64_t kCheckpointVersion = 2;

struct CheckpointState {
  std::string model;  // "gpt", "bert", "t5"
  std::int64_t iteration = 0, consumed_samples = 0, optimizer_steps = 0, seed = 0;
  double loss_scale = 1.0;
  // fp16 dynamic loss scaling state and the count of skipped (overflowing) iterations
  std::int64_t loss_scale_growth_tracker = 0, loss_scale_hysteresis_tracker = 0, skipped_iterations = 0;
  std::string dtype = "fp32";  // the run's precision.dtype
  std::string deck;            // resolved INI text
  // A LoRA run's checkpoint (adapters only): the base checkpoint file its adapters were trained
  // on, and that file's digest (checkpoint_digest); empty otherwise.
  std::string lora_base, lora_base_digest;
};

// Which of a store's tensors a checkpoint holds or a load reads: every one; a LoRA run's
// adapters alone (what its checkpoints hold); or all but the adapters (its frozen base model).
enum class TensorSet { all, adapters, base };

// Where a save's wall time went on world rank 0 (seconds). Training waits for copy + create (the
// copy of the state to host buffers; rank 0's creation of the file and its datasets), and for a
// synchronous save for all of it; an asynchronous save's checksums, writes and fsync run on a
// background thread while training goes on, and `wait` is how long its finish() then waited for
// that thread. publish: the all-reduce of the checksums, their attributes, the rename, the
// directory flushes and `latest`.
struct SaveTimes {
  double copy = 0, create = 0, checksum = 0, write = 0, fsync = 0, wait = 0, publish = 0;
};

// Collective over topo.world(). Returns the path of the file written. A store with LoRA adapters
// writes the adapters alone (and their optimizer state), with the attributes lora_base and
// lora_base_digest of `state`. (A synchronous CheckpointSaver: begin, then finish.)
std::string save_checkpoint(const std::string& save_dir, const CheckpointState& state, const ParamStore& store,
                            const AdamW* optimizer, const Topology& topo, SaveTimes* times = nullptr);

// A checkpoint save in two halves (docs/DESIGN.md "Checkpoints", "Write path" and "Asynchronous
// save"). begin() stages the state (asynchronous: copies it to host buffers that this saver keeps
// between saves; synchronous on a host backend: the model's and optimizer's own memory), rank 0
// creates <save>/iter_N/checkpoint.h5.tmp with every dataset (contiguous, allocated) and the root
// attributes, and every rank writes the parts of the tensors it owns (its shard of the optimizer
// state; they partition every tensor) straight into the datasets' bytes with positional writes,
// checksumming them on the way, then flushes them (fsync). Asynchronously that happens on a
// thread of this saver, which makes no MPI and no HDF5 call, while training goes on. finish()
// waits for it, agrees on errors, finiteness and the checksums (one all-reduce), and rank 0
// writes the checksum attributes, flushes, renames the file into place and publishes `latest`.
// Until then `latest` names the previous checkpoint; a failed save removes its .tmp file.
class CheckpointSaver {
 public:
  CheckpointSaver();
  ~CheckpointSaver();  // joins a writer still running (its .tmp file stays; `latest` is untouched)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;
  // Collective over topo.world(); a save must not be pending.
  void begin(const std::string& save_dir, const CheckpointState& state, const ParamStore& store, const AdamW* optimizer,
             const Topology& topo, bool async);
  bool pending() const;
  // Fault injection (debug.checkpoint_write_pause_s): the writes pause this long half-way.
  void set_write_pause(double seconds);
  std::int64_t iteration() const;  // of the pending (or last) save
  // Collective: whether every rank's writes are done (one all-reduce of one integer); true when
  // nothing is pending.
  bool ready(const Topology& topo);
  // Collective: completes the pending save (waiting for its writes) and returns its file. Errors
  // (a full disk, a diverged run's non-finite values) are Error::all naming the problem.
  std::string finish(const Topology& topo);
  const SaveTimes& times() const;  // of the last save
  // Allocates (and touches) the host buffers of asynchronous saves now (start-up), not at the
  // first save.
  void reserve(const ParamStore& store, const AdamW* optimizer, const Topology& topo);
  // The host memory that asynchronous saves keep on this rank (bytes): the parts of the model
  // (fp32) and of the optimizer state that this rank writes (O(state / dp) with the distributed
  // optimizer), and the model's states.
  static std::int64_t host_buffer_bytes(const ParamStore& store, const AdamW* optimizer, const Topology& topo);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `load` is a save directory (uses its 'latest'), an iter_* directory, or a checkpoint.h5.
// Throws Error::all naming the problem when nothing usable is there.
std::string resolve_checkpoint(const std::string& load);

// Collective over `world`: the model kind ("gpt", "bert", "t5") of checkpoint `file`, after
// checking that it is a Trident checkpoint.
std::string checkpoint_model_kind(const std::string& file, MPI_Comm world);

// The global shape of dataset `name` of checkpoint `file` (local: call inside `collectively`).
std::vector<std::int64_t> checkpoint_tensor_shape(const std::string& file, const std::string& name);

// Collective over `world`: the resolved deck stored in checkpoint `file` (its root attribute
// `deck`), after checking that it is a Trident checkpoint of model kind `expected_model`; the
// model's shapes come from it before any parameter is declared (generation, conversion).
std::string read_checkpoint_deck(const std::string& file, const std::string& expected_model, MPI_Comm world);

// Collective over topo.world(). Loads parameters (and the optimizer state when optimizer is
// given) and returns the state attributes. Shape or kind mismatches name the tensor; so does a
// tensor whose checksum does not match (a corrupt file) or that holds NaN or inf (a diverged
// run). One pass over the file: every rank reads what it holds (its whole local model, its shard
// of the optimizer state, never more) into place, O_DIRECT where the file system allows it; then
// every rank checksums and checks the parts it owns (they partition every tensor) from memory,
// and only once every rank agrees that all passed do the values reach a device or a 16-bit model.
// A load that fails (a checksum, a non-finite value, an unreadable tensor) leaves a host fp32
// store and optimizer partly overwritten: its callers end the job, or load an older checkpoint
// over it in full (checkpoint.load = auto), which reads every value the first one did.
// `set` selects the tensors read (the others keep their values): a LoRA run reads its base
// model's (TensorSet::base) and its own checkpoints' (TensorSet::adapters).
// Where a load's wall time went on this rank (seconds): opening the file and its datasets;
// reading what the rank holds (the cold read from the disk, with the checksums of the owned parts
// taken as each read is placed); agreeing on the verdict (waiting for the other ranks' reads, and
// the checksums of datasets that HDF5 read); converting and
// copying to the model and optimizer (a device, 16-bit parameters; nothing on a host with fp32).
struct LoadTimes {
  double open = 0, read = 0, verify = 0, place = 0;
};
CheckpointState load_checkpoint(const std::string& file, const std::string& expected_model, ParamStore& store,
                                AdamW* optimizer, const Topology& topo, TensorSet set = TensorSet::all,
                                LoadTimes* times = nullptr);

// Collective over `world`: the base checkpoint that checkpoint `file`'s LoRA adapters were
// trained on (its attribute lora_base), or "" for a checkpoint of plain weights.
std::string checkpoint_lora_base(const std::string& file, MPI_Comm world);

// Collective over `world`: a digest of checkpoint `file`'s model tensors (their names and stored
// checksums), which pins the base model of LoRA adapters.
std::string checkpoint_digest(const std::string& file, MPI_Comm world);

// The checkpoint files under save directory `save`, newest first (iter_* directories holding a
// checkpoint.h5), for checkpoint.load = auto's fall-back. Local (call on one rank).
std::vector<std::string> checkpoints_newest_first(const std::string& save);

// "iter_0001234": the directory under a save directory that holds iteration `it`'s checkpoint.
std::string iter_dir_name(std::int64_t it);

// The iteration of a checkpoint file .../iter_NNNNNNN/checkpoint.h5 (-1 when not named so).
std::int64_t checkpoint_iteration_of(const std::string& file);

// Removes checkpoint.h5.tmp files (and a latest.tmp) left under `save` by saves that were killed
// or failed, and returns how many it removed. Local; call after a successful save.
int remove_stale_tmp_files(const std::string& save);

// A checkpoint written on one process, one tensor at a time and each in parts, so that a model
// larger than memory converts (checkpoint/hf_convert): the file save_checkpoint writes (format,
// root attributes, a checksum per tensor), model tensors only (has_optimizer 0). It is
// <save_dir>/iter_<iteration>/checkpoint.h5.tmp until commit() renames it and writes `latest`; a
// writer destroyed before commit() removes it. Errors are Error::all naming the tensor or file.
class CheckpointFileWriter {
 public:
  CheckpointFileWriter(const std::string& save_dir, const CheckpointState& state);
  ~CheckpointFileWriter();
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;
  // Tensor `name` (e.g. "model/final_layernorm/weight") of global shape `shape`; its values come
  // from fill(row0, rows, out): rows [row0, row0 + rows) of the first dimension (row-major, all
  // further dimensions), asked for in order in parts of about 2^24 values. A NaN or an infinity is
  // refused naming the tensor.
  using Fill = std::function<void(std::int64_t row0, std::int64_t rows, float* out)>;
  void write(const std::string& name, const std::vector<std::int64_t>& shape, const Fill& fill);
  // Closes the file, renames it and writes `latest`; returns the path written.
  std::string commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A checkpoint read on one process, tensor by tensor and each in parts (converters). The file
// must be a Trident checkpoint of `expected_model` ("" accepts any), of a known format_version.
class CheckpointFileReader {
 public:
  CheckpointFileReader(const std::string& file, const std::string& expected_model);
  ~CheckpointFileReader();
  CheckpointFileReader(const CheckpointFileReader&) = delete;
  CheckpointFileReader& operator=(const CheckpointFileReader&) = delete;
  const std::string& path() const;
  std::string model() const;
  std::string deck() const;
  std::int64_t iteration() const;
  std::string dtype() const;
  // A root string attribute, or "" when the file has none of that name (lora_base, ...).
  std::string attribute(const std::string& name) const;
  std::int64_t int_attribute(const std::string& name) const;  // throws naming a missing one
  bool has(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const;  // throws naming a missing tensor
  // The names of the tensors (datasets) that start with `prefix` ("model/"), sorted.
  std::vector<std::string> tensors(const std::string& prefix) const;
  // Calls f(row0, rows, values) for consecutive parts of about 2^24 values of tensor `name`,
  // then checks the tensor's stored checksum (version 2) and throws naming the tensor when it
  // differs (a corrupt file) or when a value is NaN or infinite.
  using Visit = std::function<void(std::int64_t row0, std::int64_t rows, const float* values)>;
  void read(const std::string& name, const Visit& f) const;
  // The whole tensor (checked as read() checks it).
  std::vector<float> read_all(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes one flat buffer laid out like `store` as named global tensors (prefix + name) into a
// new HDF5 file (collective; e.g. gradients for validation). Attributes: iteration.
void save_named_tensors(const std::string& path, const std::string& prefix, const ParamStore& store,
                        const FloatView& buffer, std::int64_t iteration, const Topology& topo);

}  // namespace trident
