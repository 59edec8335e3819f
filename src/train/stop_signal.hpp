// Time limits and preemption (Slurm): SIGUSR1 (`sbatch --signal=USR1@N`, or forwarded by the job
// script for `--signal=B:USR1@N`) and SIGTERM (Slurm's time limit, scancel, preemption) ask the
// run to stop. A watcher thread takes them (they are blocked in every other thread) and only sets
// a flag; the training loop asks at every iteration boundary
// whether any rank has seen a signal (one integer all-reduced over the world, so every rank
// decides alike even when the signal reached only some of them), writes a checkpoint and exits
// with kExitCheckpointed. A resubmitted or requeued job continues with `--checkpoint.load auto`.
#pragma once
#include <string>

#include "comm/communicator.hpp"

namespace trident {

// Exit codes of the pretraining apps (docs/DESIGN.md "Exit codes").
inline constexpr int kExitSuccess = 0;       // every iteration done
inline constexpr int kExitCheckpointed = 3;  // stopped by a signal after writing a checkpoint: resubmit to continue
inline constexpr int kExitStoppedNoCheckpoint = 4;  // stopped by a signal, checkpoint.save unset: nothing to resume

// Blocks SIGUSR1 and SIGTERM in the calling thread (so in every thread created after it) and
// starts the watcher thread that takes them. Call before MPI_Init (the app driver does). Without a
// StopSignal armed (start-up, shut-down, apps without a training loop) a signal ends the process
// with a message and kExitStoppedNoCheckpoint (nothing was trained that a checkpoint could keep):
// rank 0 at once; another rank after up to 2 s, in which the launcher may end it with the job
// (rank 0 took the signal too), or the training loop may start and take the signal as its own.
void install_stop_signal_watcher();
// The world rank, for the watcher's message (the app driver sets it after MPI_Init).
void set_stop_signal_rank(int rank);

class StopSignal {
 public:
  StopSignal();
  // From now on (the training loop starts) SIGUSR1 and SIGTERM are recorded instead of ending the
  // process, until destruction; before, during start-up, they end it (exit code 4).
  void arm();
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;
  // Collective over `world`: the signal any rank has received since the start (0: none).
  int agreed(const Communicator& world) const;
  // The signal this process has received since the start (0: none); not collective.
  int seen() const;
  static std::string name(int signal);  // "SIGUSR1", "SIGTERM"
};

// checkpoint.load = "auto": the save directory when it holds a `latest` (a job that ran before),
// otherwise "" (a fresh start). Decided on world rank 0 and broadcast, so every rank agrees.
std::string auto_checkpoint(const std::string& load, const std::string& save, const Communicator& world);

}  // namespace trident
