// Start-up checks of the run's outputs (output_checks.hpp; docs/DESIGN.md "Before the first
// iteration"). Rank 0 makes the output directories, checks that the metrics, timeline and dropout
// dump files and the TensorBoard directory can be written (a new file is created and removed again), refuses in a run
// from scratch a non-empty metrics file or a save directory holding checkpoints unless checkpoint.overwrite, and checks
// free space for one checkpoint + 5%; then every rank creates and removes a file in checkpoint.save. Each verdict is
// agreed over the world.
#include "train/output_checks.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/agreement.hpp"
#include "comm/communicator.hpp"
#include "common/error.hpp"
#include "io/deck.hpp"
#include "io/metrics.hpp"

namespace trident {

namespace fs = std::filesystem;

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.precision(u ? 3 : 0);
  os << std::fixed << b << " " << units[u];
  return os.str();
}

// Creates `dir` and its parents; "" when it exists as a directory afterwards, else why not.
std::string ensure_dir(const std::string& key, const std::string& dir) {
  if (dir.empty()) return "";
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) return key + ": '" + dir + "' exists and is not a directory";
    return "";
  }
  fs::create_directories(dir, ec);
  if (ec) return key + ": cannot create the directory '" + dir + "': " + ec.message();
  return "";
}

// A file can be created in `dir` (and removed again): "" or why not.
std::string probe_dir(const std::string& key, const std::string& dir, int rank) {
  const std::string probe = (fs::path(dir) / (".trident-write-test-" + std::to_string(rank) + "-" +
                                              std::to_string(static_cast<long>(getpid()))))
                                .string();
  {
    std::ofstream f(probe, std::ios::trunc);
    f << "x";
    f.flush();
    if (!f) {
      const std::string why = std::strerror(errno);
      std::remove(probe.c_str());
      return key + ": cannot write in '" + dir + "' (rank " + std::to_string(rank) + "): " + why;
    }
  }
  std::remove(probe.c_str());
  return "";
}

// An output file that rank 0 will write: its directory made, the file writable; a file with
// content from an earlier run is refused when this run starts from scratch (unless overwrite).
std::string check_output_file(const std::string& key, const std::string& path, bool fresh, bool overwrite) {
  if (path.empty()) return "";
  std::error_code ec;
  const fs::path p(path);
  if (std::string e = ensure_dir(key, p.has_parent_path() ? p.parent_path().string() : "."); !e.empty()) return e;
  if (fs::exists(p, ec)) {
    if (fs::is_directory(p, ec)) return key + ": '" + path + "' is a directory";
    if (fresh && !overwrite && fs::file_size(p, ec) > 0 && !ec)
      return key + ": '" + path + "' holds output of an earlier run and this run starts from scratch: " +
             "resume it (checkpoint.load), write elsewhere, or set checkpoint.overwrite true to replace it";
    std::ofstream f(path, std::ios::app);  // appending nothing: checks access, changes nothing
    if (!f) return key + ": cannot write '" + path + "': " + std::strerror(errno);
    return "";
  }
  {
    std::ofstream f(path, std::ios::app);
    if (!f) return key + ": cannot write '" + path + "': " + std::strerror(errno);
  }
  std::remove(path.c_str());  // made again by its writer; none is left behind if the run stops first
  return "";
}

// "" when `dir` has room for `bytes` (5% spare), else a message that says the disk is full.
std::string room_for(const std::string& dir, std::int64_t bytes) {
  struct statvfs s {};
  if (bytes <= 0 || statvfs(dir.c_str(), &s) != 0) return "";
  const double avail = static_cast<double>(s.f_bavail) * static_cast<double>(s.f_frsize);
  if (avail >= 1.05 * static_cast<double>(bytes)) return "";
  return "checkpoint.save: '" + dir + "' has " + human_bytes(avail) +
         " free, but one checkpoint of this run takes about " + human_bytes(static_cast<double>(bytes)) +
         " (disk full)";
}

}  // namespace

void check_room_for_checkpoint(const std::string& save, std::int64_t bytes, const Communicator& world) {
  agree_or_throw(world.get(), world.rank() == 0 ? room_for(save, bytes) : std::string());
}

std::int64_t latest_checkpoint_iteration(const std::string& save) {
  if (save.empty()) return -1;
  std::ifstream in(fs::path(save) / "latest");
  std::int64_t it = -1;
  if (!(in >> it)) return -1;
  return it;
}

void check_outputs(const Deck& deck, const OutputPlan& plan, const Communicator& world) {
  const MPI_Comm comm = world.get();
  const bool root = world.rank() == 0;
  const bool fresh = !plan.resuming;
  const bool overwrite = deck.checkpoint.overwrite;
  const std::string& save = deck.checkpoint.save;
  std::string err;
  // rank 0: directories, files it alone writes, the save directory's contents and free space
  if (root) {
    err = check_output_file("log.metrics_file", deck.log.metrics_file, fresh, overwrite);
    if (err.empty() && !deck.log.metrics_file.empty() && deck.eval.interval > 0)
      err = check_output_file("log.metrics_file", sibling_metrics_path(deck.log.metrics_file, "eval"), fresh,
                              overwrite);
    if (err.empty() && !deck.log.metrics_file.empty() && deck.model.moe.on())  // each MoE layer's expert loads
      err = check_output_file("log.metrics_file", sibling_metrics_path(deck.log.metrics_file, "moe"), fresh, overwrite);
    if (err.empty()) err = check_output_file("log.timeline_file", deck.log.timeline_file, false, true);
    if (err.empty()) err = check_output_file("log.memory_file", deck.log.memory_file, false, true);
    if (err.empty()) err = check_output_file("debug.dump_dropout", deck.debug.dump_dropout, false, true);
    if (err.empty() && !deck.debug.dump_params.empty()) err = ensure_dir("debug.dump_params", deck.debug.dump_params);
    if (err.empty() && !deck.log.tensorboard_dir.empty())
      err = ensure_dir("log.tensorboard_dir", deck.log.tensorboard_dir);
    if (err.empty() && !deck.log.tensorboard_dir.empty())
      err = probe_dir("log.tensorboard_dir", deck.log.tensorboard_dir, 0);
    if (err.empty() && !save.empty()) err = ensure_dir("checkpoint.save", save);
    if (err.empty() && !save.empty() && fresh && !overwrite) {
      const std::int64_t latest = latest_checkpoint_iteration(save);
      bool any = latest >= 0;
      std::error_code ec;
      for (fs::directory_iterator d(save, ec), end; !any && !ec && d != end; d.increment(ec))
        any = d->path().filename().string().rfind("iter_", 0) == 0;
      if (any)
        err = "checkpoint.save: '" + save + "' already holds checkpoints" +
              (latest >= 0 ? " (latest: iteration " + std::to_string(latest) + ")" : std::string()) +
              " and this run starts from scratch: resume them (checkpoint.load " + save +
              ", or auto), save elsewhere, or set checkpoint.overwrite true to replace them";
    }
    if (err.empty() && !save.empty()) err = room_for(save, plan.checkpoint_bytes);
  }
  agree_or_throw(comm, err);
  // every rank writes its part of each checkpoint: the save directory must be writable from all
  if (!save.empty()) agree_or_throw(comm, probe_dir("checkpoint.save", save, world.rank()));
}

}  // namespace trident
