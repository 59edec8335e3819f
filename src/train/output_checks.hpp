// Start-up checks of everything a training run will write, made before its first iteration so
// that a week-long job does not find out at its first checkpoint, or at its end, that it cannot
// write (issue 17):
//  - log.metrics_file (and its .eval sibling) and log.timeline_file: their directories are
//    created when missing (as Megatron creates its save directory) and the files must be writable;
//  - checkpoint.save: created when missing, writable from every rank (parallel HDF5 writes from
//    all of them), with free space for at least one checkpoint of this run;
//  - nothing already written is replaced by a run that starts from scratch: a save directory that
//    holds checkpoints, or a metrics file with rows, is refused unless checkpoint.overwrite is
//    true (a resumed run appends instead).
// Collective over the world: every rank throws the same Error::all, naming the key and the path.
#pragma once
#include <cstdint>
#include <string>

namespace trident {

struct Deck;
class Communicator;

struct OutputPlan {
  bool resuming = false;              // the run continues from a checkpoint (checkpoint.load / auto)
  std::int64_t checkpoint_bytes = 0;  // the size of one checkpoint of this run (0: unknown)
};

void check_outputs(const Deck& deck, const OutputPlan& plan, const Communicator& world);

// Before each checkpoint: room for `bytes` more in `save` (rank 0 looks; agreed), so that a disk
// filled by earlier checkpoints stops the job with "disk full" instead of failing, or hanging in
// parallel HDF5's collective close, halfway through a write.
void check_room_for_checkpoint(const std::string& save, std::int64_t bytes, const Communicator& world);

// The iteration recorded in `save`'s `latest`, or -1 when there is none.
std::int64_t latest_checkpoint_iteration(const std::string& save);

}  // namespace trident
