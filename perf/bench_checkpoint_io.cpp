// bench_checkpoint_io: a checkpoint save and load without a model or training (perf/bench_checkpoint.py
// runs it), so that a state larger than the 345M deck's fits a small machine: a synthetic model of
// about --params fp32 parameters in [hidden, hidden] matrices over the world's ranks: data parallel
// with the distributed optimizer's moments (ZeRO-1 shards; every rank holds the whole model), or
// with --tp N split by rows over N tensor-parallel ranks (each holds 1/N of the model and its
// moments), every value a deterministic function of its flat index and the seed. Prints one line of key=value figures
// per phase:
//   --mode save:  save_s (the whole save, synchronous or asynchronous), stall_s (what training
//                 would wait: the whole save, or the copy and file creation of an asynchronous one),
//                 copy_s create_s checksum_s write_s fsync_s wait_s publish_s (rank 0), bytes (file)
//   --mode load:  load_s (open_s; read_s: the cold read into place; verify_s: the checksums from
//                 memory and the ranks' agreement; place_s: copies to the model, none here),
//                 then checks every element of the loaded model and moments against the
//                 values it would have saved (exit 1 on a difference)
// and rss_before_mb_max (the largest rank's resident memory before the first save or load),
// peak_rss_mb_sum and peak_rss_mb_max (the ranks' peak resident memory: sum, largest).
//
//   mpiexec -n 2 bench_checkpoint_io --dir /path/ck --params 600000000 --mode save [--async]
//   mpiexec -n 2 bench_checkpoint_io --dir /path/ck --params 600000000 --mode load
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "comm/mpi_job.hpp"
#include "common/error.hpp"
#include "common/timer.hpp"

namespace po = boost::program_options;
using namespace trident;

namespace {
// A figure of /proc/self/status in MiB: VmHWM (the peak resident memory), VmRSS (now).
double status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string want = std::string(field) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(want, 0) == 0) return std::stod(line.substr(want.size())) / 1024.0;  // kB
  return -1;
}
double peak_rss_mb() { return status_mb("VmHWM"); }

// The value of element i of buffer `which` (0 model, 1 exp_avg, 2 exp_avg_sq): finite, varied.
KOKKOS_INLINE_FUNCTION float synthetic(std::int64_t i, int which, std::uint64_t seed) {
  std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL + seed * 0xbf58476d1ce4e5b9ULL +
                    static_cast<std::uint64_t>(which);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 29;
  const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return which == 2 ? u * 1e-4f : u - 0.5f;
}

// Empties the page cache (as root; without root the next load may read from memory), after every
// rank's writes are on the disk.
void drop_page_cache(const Topology& topo) {
  ::sync();
  if (topo.world().rank() == 0) {
    std::ofstream out("/proc/sys/vm/drop_caches");
    out << "3\n";
  }
  topo.world().barrier();
}

// Fills buffer `v` (the flat elements from `begin` on) with synthetic(begin + i, which, seed).
void fill(const FloatView& v, std::int64_t begin, int which, std::uint64_t seed) {
  Kokkos::parallel_for(
      "bench::fill", range(static_cast<std::int64_t>(v.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) { v(i) = synthetic(begin + i, which, seed); });
}

// Elements of `v` (flat elements from `begin` on, within [0, limit)) that differ from the pattern.
std::int64_t mismatches(const FloatView& v, std::int64_t begin, std::int64_t limit, int which, std::uint64_t seed) {
  std::int64_t bad = 0;
  const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(v.extent(0)), limit - begin);
  Kokkos::parallel_reduce(
      "bench::check", range(std::max<std::int64_t>(n, 0)),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & sum) {
        if (v(i) != synthetic(begin + i, which, seed)) ++sum;
      },
      bad);
  return bad;
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir, mode = "save";
  std::int64_t params = 600000000, hidden = 4096, tp = 1, repeat = 1;
  std::uint64_t seed = 1234;
  bool async = false;
  po::options_description opts("bench_checkpoint_io");
  auto add = opts.add_options();
  add("help", "this text");
  add("dir", po::value(&dir)->required(), "checkpoint save directory");
  add("params", po::value(&params)->default_value(params), "parameters (about; whole matrices)");
  add("hidden", po::value(&hidden)->default_value(hidden), "the matrices' side");
  add("tp", po::value(&tp)->default_value(tp), "tensor-parallel ranks (the rest data parallel)");
  add("mode", po::value(&mode)->default_value(mode), "save or load");
  add("async", po::bool_switch(&async), "an asynchronous save");
  add("repeat", po::value(&repeat)->default_value(repeat),
      "saves in a row (iterations 1, 2, ...), or loads in a row (the page cache emptied before each but the first, as "
      "root): one line each");
  add("seed", po::value(&seed)->default_value(seed), "of the synthetic values");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "bench_checkpoint_io: " << e.what() << "\n";
    return 2;
  }
  mpi_job::init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      Topology topo(MPI_COMM_WORLD, static_cast<int>(tp), 1);
      const int dp = topo.dp_size(), rank = topo.world().rank(), t = topo.coords().tp;
      TRIDENT_REQUIRE(hidden % tp == 0, "--hidden must be a multiple of --tp");
      ParamStore store;
      const std::int64_t matrices = std::max<std::int64_t>(1, (params + hidden * hidden - 1) / (hidden * hidden));
      for (std::int64_t l = 0; l < matrices; ++l) {
        ParamInfo p;
        p.name = "model/layers/" + std::to_string(l) + "/weight";
        p.shape = {hidden / tp, hidden};
        p.global_shape = {hidden, hidden};
        p.global_offset = {t * hidden / tp, 0};
        p.valid = p.shape;
        p.tp_replicated = tp == 1;
        p.weight_decay = true;
        p.init_std = 0.02f;
        store.declare(p);
      }
      store.allocate(static_cast<std::int64_t>(dp) * 4096);
      const std::int64_t shard = store.padded_size() / dp, begin = shard * topo.coords().dp;
      AdamW opt(AdamWConfig{}, std::vector<AdamW::Segment>{AdamW::Segment{begin, shard, store.decay_size(), false, 0}});
      const std::int64_t bytes = store.global_count() * 3 * static_cast<std::int64_t>(sizeof(float));
      CheckpointState st;
      st.model = "gpt";
      st.iteration = 1;
      st.optimizer_steps = 1;
      st.deck = "[bench]\n";
      char line[512];
      double rss_before = 0;  // the largest rank's resident memory before the first save or load (MiB)
      if (mode == "save") {
        fill(store.values(), 0, 0, seed);
        fill(opt.exp_avg(), begin, 1, seed);
        fill(opt.exp_avg_sq(), begin, 2, seed);
        opt.set_steps(1);
        Kokkos::fence();
        topo.world().barrier();
        rss_before = topo.world().allreduce_max(status_mb("VmRSS"));
        CheckpointSaver saver;
        for (std::int64_t k = 1; k <= repeat; ++k) {
          st.iteration = k;
          topo.world().barrier();
          const double t0 = wall_seconds();
          saver.begin(dir, st, store, &opt, topo, async);
          const double stall = wall_seconds() - t0;
          saver.finish(topo);
          const double total = wall_seconds() - t0;
          const SaveTimes& t = saver.times();
          std::snprintf(line, sizeof line,
                        "save_s=%.3f stall_s=%.3f copy_s=%.3f create_s=%.3f checksum_s=%.3f write_s=%.3f fsync_s=%.3f "
                        "wait_s=%.3f publish_s=%.3f bytes=%lld",
                        total, async ? stall : total, t.copy, t.create, t.checksum, t.write, t.fsync, t.wait, t.publish,
                        static_cast<long long>(bytes));
          if (k < repeat && rank == 0) std::printf("%s\n", line);
        }
      } else if (mode == "load") {
        rss_before = topo.world().allreduce_max(status_mb("VmRSS"));
        for (std::int64_t k = 1; k <= repeat; ++k) {
          if (k > 1) drop_page_cache(topo);  // each load reads the file from the disk
          topo.world().barrier();
          const double t0 = wall_seconds();
          LoadTimes lt;
          load_checkpoint(resolve_checkpoint(dir), "gpt", store, &opt, topo, TensorSet::all, &lt);
          const double dt = wall_seconds() - t0;
          const std::int64_t n = store.size();
          std::int64_t bad = mismatches(store.values(), 0, n, 0, seed) + mismatches(opt.exp_avg(), begin, n, 1, seed) +
                             mismatches(opt.exp_avg_sq(), begin, n, 2, seed);
          bad = topo.world().allreduce_sum(bad);
          if (bad != 0) {
            if (rank == 0) std::fprintf(stderr, "bench_checkpoint_io: %lld loaded values differ\n", (long long)bad);
            rc = 1;
          }
          std::snprintf(line, sizeof line,
                        "load_s=%.3f open_s=%.3f read_s=%.3f verify_s=%.3f place_s=%.3f bytes=%lld mismatches=%lld", dt,
                        lt.open, lt.read, lt.verify, lt.place, static_cast<long long>(bytes),
                        static_cast<long long>(bad));
          if (k < repeat && rank == 0) std::printf("%s\n", line);
          // the next load must change every value: scribble over the model and the moments
          if (k < repeat) {
            Kokkos::deep_copy(store.values(), -1.f);
            Kokkos::deep_copy(opt.exp_avg(), -1.f);
            Kokkos::deep_copy(opt.exp_avg_sq(), -1.f);
          }
        }
      } else {
        throw Error::all("--mode must be save or load, not '" + mode + "'");
      }
      const double rss = topo.world().allreduce_sum(peak_rss_mb()), rss_max = topo.world().allreduce_max(peak_rss_mb());
      if (rank == 0)
        std::printf(
            "%s ranks=%d tp=%lld params=%lld rss_before_mb_max=%.0f peak_rss_mb_sum=%.0f peak_rss_mb_max=%.0f\n", line,
            topo.world_size(), static_cast<long long>(tp), static_cast<long long>(store.global_count()), rss_before,
            rss, rss_max);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_checkpoint_io: %s\n", e.what());
      std::fflush(stderr);
      mpi_job::abort_job(1);
    }
  }
  mpi_job::finalize();
  return rc;
}
