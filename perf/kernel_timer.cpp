// trident_kernel_timer: a Kokkos Tools profiling library that adds up wall time and call counts
// per kernel label (parallel_for / parallel_reduce / parallel_scan, deep_copy) and per profiling
// region (Kokkos::Profiling::pushRegion/popRegion, e.g. "ops::gemm"), counts events
// (Kokkos::Profiling::markEvent, e.g. the host's waits for the device, "trident::wait FILE:LINE")
// and View allocations ("allocate SPACE LABEL"), and prints a table sorted by time when Kokkos
// finalizes.
//
//   KOKKOS_PROFILE_LIBRARY=/path/libtrident_kernel_timer.so  ./app ...
//
// Environment:
//   TRIDENT_KERNEL_TIMER_OUT   file for the report (default: stderr). A name ending in ".json" gets
//                              JSON instead of the text table. "%r" in the name is replaced by the
//                              MPI rank (PMI_RANK / OMPI_COMM_WORLD_RANK / SLURM_PROCID); without
//                              "%r", ranks > 0 write to "<name>.rank<r>" so that files never clash.
//   TRIDENT_KERNEL_TIMER_SKIP  "label:count": forget everything measured until the count-th call of
//                              the kernel or region `label` has ended (e.g. "optim::adamw_step:2"
//                              drops the first two training iterations, the warm-up).
//   TRIDENT_KERNEL_TIMER_NVTX  "1" (a CUDA build's library only): every kernel and region is also an
//                              NVTX push/pop range named by its label, so that Nsight Compute
//                              profiles the launches of one label (ncu --nvtx --nvtx-include
//                              "ops::layernorm_forward/"; scripts/gpu_check.sh's ncu phase).
//
// Kernels of host back-ends (Serial, and OpenMP after its implicit barrier) are synchronous, so
// the wall time between the begin and end callbacks is the kernel's time. On asynchronous
// back-ends (CUDA) it is only the launch time unless the run fences globally
// (CUDA_LAUNCH_BLOCKING=1 or a kernel-fencing Kokkos setting).
//
// Regions are reported apart from kernels: a region's time is inclusive (it contains the kernels
// and regions that run inside it). The summary splits the whole time into time inside top-level
// regions, time in kernels outside any region, and the rest (host code between kernels: data
// loading, MPI, launch overhead, I/O).
//
// The library does not link Kokkos: the C interface below is the stable Kokkos Tools ABI
// (Kokkos 3.x and 4.x).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(TRIDENT_KERNEL_TIMER_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

// NVTX ranges named by the labels, when asked for (TRIDENT_KERNEL_TIMER_NVTX=1 in a CUDA build)
#if defined(TRIDENT_KERNEL_TIMER_NVTX)
bool nvtx_on() {
  static const bool on = [] {
    const char* v = std::getenv("TRIDENT_KERNEL_TIMER_NVTX");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}
#endif
void nvtx_push([[maybe_unused]] const char* name) {
#if defined(TRIDENT_KERNEL_TIMER_NVTX)
  if (nvtx_on()) nvtxRangePushA(name);
#endif
}
void nvtx_pop() {
#if defined(TRIDENT_KERNEL_TIMER_NVTX)
  if (nvtx_on()) nvtxRangePop();
#endif
}

double seconds_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

enum class Kind { region, parallel_for, parallel_reduce, parallel_scan, deep_copy, event };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::region: return "region";
    case Kind::parallel_for: return "for";
    case Kind::parallel_reduce: return "reduce";
    case Kind::parallel_scan: return "scan";
    case Kind::deep_copy: return "copy";
    case Kind::event: return "event";
  }
  return "?";
}

struct Entry {
  std::string name;
  Kind kind;
  double seconds = 0;            // inclusive wall time
  double seconds_in_region = 0;  // part of it spent inside an open region (kernels only)
  std::uint64_t calls = 0;
};

// One open activity: a kernel, a deep copy or a region.
struct Open {
  std::size_t entry;
  Clock::time_point t0;
};

constexpr std::size_t kInsideCopy = static_cast<std::size_t>(-1);

class Timer {
 public:
  void init() {
    start_ = Clock::now();
    if (const char* s = std::getenv("TRIDENT_KERNEL_TIMER_SKIP")) parse_skip(s);
  }

  std::uint64_t begin_kernel(const char* name, Kind kind) {
    const std::uint64_t id = next_id_++;
    // A kernel that a deep_copy launches (Kokkos::ViewFill, ...) is counted as part of the copy.
    const std::size_t entry = copies_open_.empty() ? lookup(name, kind) : kInsideCopy;
    kernels_open_.emplace(id, Open{entry, Clock::now()});
    ++depth_;
    return id;
  }

  void end_kernel(std::uint64_t id) {
    const auto now = Clock::now();
    auto it = kernels_open_.find(id);
    if (it == kernels_open_.end()) return;
    const Open o = it->second;
    kernels_open_.erase(it);
    close(o, now, /*in_region=*/!regions_open_.empty());
  }

  void push_region(const char* name) {
    regions_open_.push_back(Open{lookup(name, Kind::region), Clock::now()});
    ++depth_;
  }

  void pop_region() {
    const auto now = Clock::now();
    if (regions_open_.empty()) return;
    const Open o = regions_open_.back();
    regions_open_.pop_back();
    close(o, now, false);
  }

  // An event (Kokkos::Profiling::markEvent): counted, no time (e.g. "trident::wait FILE:LINE", a
  // blocking wait of the host for the device, common/device_wait.hpp).
  void event(const char* name) { ++entries_[lookup(name, Kind::event)].calls; }

  // A fill (deep_copy(view, value)) is named after the view; a copy after the two memory spaces.
  void begin_copy(const char* dst_space, const char* dst, const char* src_space, const char* src) {
    std::string name = "deep_copy ";
    if (std::strcmp(src, "Scalar") == 0) {
      name += "fill ";
      name += dst;
    } else {
      name += dst_space;
      name += "<-";
      name += src_space;
    }
    copies_open_.push_back(Open{lookup(name.c_str(), Kind::deep_copy), Clock::now()});
    ++depth_;
  }

  void end_copy() {
    const auto now = Clock::now();
    if (copies_open_.empty()) return;
    const Open o = copies_open_.back();
    copies_open_.pop_back();
    close(o, now, !regions_open_.empty());
  }

  void finalize() {
    const auto now = Clock::now();
    const double total = seconds_since(start_, now);
    std::string path;
    if (const char* p = std::getenv("TRIDENT_KERNEL_TIMER_OUT")) path = p;
    FILE* f = stderr;
    if (!path.empty()) {
      path = with_rank(path);
      f = std::fopen(path.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "trident_kernel_timer: cannot write %s; report follows on stderr\n", path.c_str());
        f = stderr;
        path.clear();
      }
    }
    const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
    std::vector<const Entry*> regions, kernels, events;
    for (const Entry& e : entries_)
      if (e.calls > 0) (e.kind == Kind::region ? regions : e.kind == Kind::event ? events : kernels).push_back(&e);
    auto by_time = [](const Entry* a, const Entry* b) { return a->seconds > b->seconds; };
    std::sort(regions.begin(), regions.end(), by_time);
    std::sort(kernels.begin(), kernels.end(), by_time);
    std::sort(events.begin(), events.end(), [](const Entry* a, const Entry* b) { return a->calls > b->calls; });
    double kernels_outside = 0;
    for (const Entry* e : kernels) kernels_outside += e->seconds - e->seconds_in_region;
    const double other = std::max(0.0, total - top_level_);
    if (json)
      write_json(f, total, regions, kernels, events, kernels_outside, other);
    else
      write_text(f, total, regions, kernels, events, kernels_outside, other);
    if (f != stderr) std::fclose(f);
  }

 private:
  std::size_t lookup(const char* name, Kind kind) {
    std::string key(name ? name : "(unnamed)");
    key.push_back('\x1f');
    key.push_back(static_cast<char>('0' + static_cast<int>(kind)));
    auto it = index_.find(key);
    if (it != index_.end()) return it->second;
    entries_.push_back(Entry{name ? name : "(unnamed)", kind});
    index_.emplace(std::move(key), entries_.size() - 1);
    return entries_.size() - 1;
  }

  void close(const Open& o, Clock::time_point now, bool in_region) {
    const double dt = seconds_since(o.t0, now);
    if (o.entry == kInsideCopy) {
      --depth_;
      return;
    }
    Entry& e = entries_[o.entry];
    e.seconds += dt;
    if (in_region) e.seconds_in_region += dt;
    ++e.calls;
    --depth_;
    if (depth_ == 0) top_level_ += dt;
    if (!skip_done_ && e.name == skip_name_ && e.calls >= skip_count_) reset(now);
  }

  // Forget everything measured so far; activities still open restart at `now`.
  void reset(Clock::time_point now) {
    skip_done_ = true;
    for (Entry& e : entries_) {
      e.seconds = 0;
      e.seconds_in_region = 0;
      e.calls = 0;
    }
    top_level_ = 0;
    start_ = now;
    for (auto& kv : kernels_open_) kv.second.t0 = now;
    for (Open& o : regions_open_) o.t0 = now;
    for (Open& o : copies_open_) o.t0 = now;
  }

  void parse_skip(const char* s) {
    const std::string spec(s);
    const auto colon = spec.rfind(':');
    if (spec.empty()) return;
    skip_name_ = colon == std::string::npos ? spec : spec.substr(0, colon);
    skip_count_ = 1;
    if (colon != std::string::npos) {
      char* end = nullptr;
      const long long c = std::strtoll(spec.c_str() + colon + 1, &end, 10);
      if (end == spec.c_str() + colon + 1 || *end != '\0' || c < 0) {
        std::fprintf(stderr, "trident_kernel_timer: TRIDENT_KERNEL_TIMER_SKIP='%s' is not label:count; ignored\n", s);
        skip_name_.clear();
        return;
      }
      skip_count_ = static_cast<std::uint64_t>(c);
    }
    if (skip_count_ == 0) skip_name_.clear();
    skip_done_ = skip_name_.empty();
  }

  static std::string with_rank(std::string path) {
    int rank = 0;
    for (const char* var : {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
      if (const char* v = std::getenv(var)) {
        rank = std::atoi(v);
        break;
      }
    }
    const std::string r = std::to_string(rank);
    const auto pos = path.find("%r");
    if (pos != std::string::npos) return path.replace(pos, 2, r);
    if (rank > 0) path += ".rank" + r;
    return path;
  }

  std::string skip_note() const {
    if (skip_name_.empty()) return "";
    return skip_done_ ? "after the first " + std::to_string(skip_count_) + " call(s) of " + skip_name_
                      : "NOTE: " + skip_name_ + " ran fewer than " + std::to_string(skip_count_) +
                            " times, nothing was skipped";
  }

  void write_text(FILE* f, double total, const std::vector<const Entry*>& regions,
                  const std::vector<const Entry*>& kernels, const std::vector<const Entry*>& events,
                  double kernels_outside, double other) const {
    auto pct = [total](double s) { return total > 0 ? 100.0 * s / total : 0.0; };
    std::fprintf(f, "\n=== trident_kernel_timer: %.4f s measured, init to finalize", total);
    const std::string note = skip_note();
    if (!note.empty()) std::fprintf(f, " (%s)", note.c_str());
    std::fprintf(f, " ===\n");
    std::fprintf(f, "Regions (inclusive time; contain the kernels/regions run inside them)\n");
    std::fprintf(f, "%12s %8s %10s %12s  %s\n", "time [s]", "% total", "calls", "us/call", "region");
    for (const Entry* e : regions)
      std::fprintf(f, "%12.4f %8.2f %10llu %12.2f  %s\n", e->seconds, pct(e->seconds),
                   static_cast<unsigned long long>(e->calls), e->calls ? 1e6 * e->seconds / e->calls : 0.0,
                   e->name.c_str());
    std::fprintf(f, "Kernels (parallel_for/reduce/scan, deep_copy)\n");
    std::fprintf(f, "%12s %8s %10s %12s %7s  %s\n", "time [s]", "% total", "calls", "us/call", "type", "kernel");
    for (const Entry* e : kernels)
      std::fprintf(f, "%12.4f %8.2f %10llu %12.2f %7s  %s\n", e->seconds, pct(e->seconds),
                   static_cast<unsigned long long>(e->calls), e->calls ? 1e6 * e->seconds / e->calls : 0.0,
                   kind_name(e->kind), e->name.c_str());
    if (!events.empty()) {
      std::fprintf(f, "Events (counted)\n");
      std::fprintf(f, "%10s  %s\n", "calls", "event");
      for (const Entry* e : events)
        std::fprintf(f, "%10llu  %s\n", static_cast<unsigned long long>(e->calls), e->name.c_str());
    }
    const double in_regions = total - other - kernels_outside;
    std::fprintf(f, "Summary\n");
    std::fprintf(f, "%12.4f %8.2f  top-level regions\n", std::max(0.0, in_regions), pct(std::max(0.0, in_regions)));
    std::fprintf(f, "%12.4f %8.2f  kernels outside regions\n", kernels_outside, pct(kernels_outside));
    std::fprintf(f, "%12.4f %8.2f  other (host code between kernels: data, MPI, launches, I/O)\n", other, pct(other));
    std::fprintf(f, "%12.4f %8.2f  total\n", total, 100.0);
    std::fflush(f);
  }

  static void json_string(FILE* f, const std::string& s) {
    std::fputc('"', f);
    for (char c : s) {
      if (c == '"' || c == '\\')
        std::fprintf(f, "\\%c", c);
      else if (static_cast<unsigned char>(c) < 0x20)
        std::fprintf(f, "\\u%04x", c);
      else
        std::fputc(c, f);
    }
    std::fputc('"', f);
  }

  void write_json(FILE* f, double total, const std::vector<const Entry*>& regions,
                  const std::vector<const Entry*>& kernels, const std::vector<const Entry*>& events,
                  double kernels_outside, double other) const {
    std::fprintf(f, "{\n  \"total_s\": %.9g,\n  \"skip\": ", total);
    json_string(f, skip_note());
    auto list = [&](const char* key, const std::vector<const Entry*>& v) {
      std::fprintf(f, ",\n  \"%s\": [", key);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const Entry* e = v[i];
        std::fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        json_string(f, e->name);
        std::fprintf(f, ", \"type\": \"%s\", \"seconds\": %.9g, \"seconds_in_region\": %.9g, \"calls\": %llu}",
                     kind_name(e->kind), e->seconds, e->seconds_in_region, static_cast<unsigned long long>(e->calls));
      }
      std::fprintf(f, "\n  ]");
    };
    list("regions", regions);
    list("kernels", kernels);
    list("events", events);
    std::fprintf(f,
                 ",\n  \"summary\": {\"top_level_regions_s\": %.9g, \"kernels_outside_regions_s\": %.9g, "
                 "\"other_s\": %.9g}\n}\n",
                 std::max(0.0, total - other - kernels_outside), kernels_outside, other);
    std::fflush(f);
  }

  Clock::time_point start_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, std::size_t> index_;
  std::unordered_map<std::uint64_t, Open> kernels_open_;
  std::vector<Open> regions_open_;
  std::vector<Open> copies_open_;
  std::uint64_t next_id_ = 1;
  int depth_ = 0;         // open activities of any kind
  double top_level_ = 0;  // time covered by activities that ended with nothing else open
  std::string skip_name_;
  std::uint64_t skip_count_ = 0;
  bool skip_done_ = true;
};

Timer* g_timer = nullptr;

}  // namespace

// ---- Kokkos Tools C interface (names and signatures fixed by Kokkos) -------------------------
struct Kokkos_Profiling_KokkosPDeviceInfo;
struct TridentSpaceHandle {  // Kokkos_Profiling_SpaceHandle: passed by value
  char name[64];
};

extern "C" {

void kokkosp_init_library(const int /*load_seq*/, const std::uint64_t /*interface_version*/,
                          const std::uint32_t /*dev_info_count*/, Kokkos_Profiling_KokkosPDeviceInfo* /*info*/) {
  if (!g_timer) g_timer = new Timer();
  g_timer->init();
}

void kokkosp_finalize_library() {
  if (!g_timer) return;
  g_timer->finalize();
  delete g_timer;
  g_timer = nullptr;
}

void kokkosp_begin_parallel_for(const char* name, const std::uint32_t /*dev*/, std::uint64_t* kid) {
  nvtx_push(name);
  *kid = g_timer ? g_timer->begin_kernel(name, Kind::parallel_for) : 0;
}
void kokkosp_end_parallel_for(const std::uint64_t kid) {
  if (g_timer) g_timer->end_kernel(kid);
  nvtx_pop();
}
void kokkosp_begin_parallel_reduce(const char* name, const std::uint32_t /*dev*/, std::uint64_t* kid) {
  nvtx_push(name);
  *kid = g_timer ? g_timer->begin_kernel(name, Kind::parallel_reduce) : 0;
}
void kokkosp_end_parallel_reduce(const std::uint64_t kid) {
  if (g_timer) g_timer->end_kernel(kid);
  nvtx_pop();
}
void kokkosp_begin_parallel_scan(const char* name, const std::uint32_t /*dev*/, std::uint64_t* kid) {
  nvtx_push(name);
  *kid = g_timer ? g_timer->begin_kernel(name, Kind::parallel_scan) : 0;
}
void kokkosp_end_parallel_scan(const std::uint64_t kid) {
  if (g_timer) g_timer->end_kernel(kid);
  nvtx_pop();
}
void kokkosp_push_profile_region(const char* name) {
  nvtx_push(name);
  if (g_timer) g_timer->push_region(name);
}
void kokkosp_pop_profile_region() {
  if (g_timer) g_timer->pop_region();
  nvtx_pop();
}
void kokkosp_begin_deep_copy(TridentSpaceHandle dst_handle, const char* dst_name, const void* /*dst_ptr*/,
                             TridentSpaceHandle src_handle, const char* src_name, const void* /*src_ptr*/,
                             std::uint64_t /*size*/) {
  if (g_timer) {
    dst_handle.name[63] = '\0';
    src_handle.name[63] = '\0';
    g_timer->begin_copy(dst_handle.name, dst_name ? dst_name : "", src_handle.name, src_name ? src_name : "");
  }
}
void kokkosp_end_deep_copy() {
  if (g_timer) g_timer->end_copy();
}
// a View's allocation: counted as an event "allocate SPACE LABEL" (a cudaMalloc in a CUDA build,
// which waits for the device)
void kokkosp_allocate_data(TridentSpaceHandle space, const char* label, const void* /*ptr*/, std::uint64_t /*size*/) {
  if (!g_timer) return;
  space.name[63] = '\0';
  std::string name = "allocate ";
  name += space.name;
  name += ' ';
  name += label ? label : "";
  g_timer->event(name.c_str());
}
void kokkosp_profile_event(const char* name) {
  if (g_timer) g_timer->event(name ? name : "(unnamed)");
}

}  // extern "C"
