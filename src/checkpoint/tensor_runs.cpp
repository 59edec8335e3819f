// Runs of a rank's tensor slices, their checksums, and positional I/O of raw dataset bytes
// (tensor_runs.hpp).
#include "checkpoint/tensor_runs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

#include "common/timer.hpp"

namespace trident {

std::vector<TensorRun> tensor_runs(const ParamInfo& p) {
  const int nd = static_cast<int>(p.shape.size());
  std::vector<TensorRun> out;
  if (nd == 0) return out;
  for (const auto& b : p.blocks) {
    // the box: local start (b.local0, 0, ...), global start (b.global0, global_offset[1..]),
    // extent (b.rows, valid[1..])
    std::vector<std::int64_t> lstart(nd, 0), gstart(p.global_offset.begin(), p.global_offset.end()),
        count(p.valid.begin(), p.valid.end());  // (nd) each
    lstart[0] = b.local0;
    gstart[0] = b.global0;
    count[0] = b.rows;
    bool empty = false;
    for (int d = 0; d < nd; ++d) empty = empty || count[d] <= 0;
    if (empty) continue;
    std::vector<std::int64_t> idx(nd, 0);  // (nd): the odometer over all dimensions but the last
    while (true) {
      std::int64_t loff = 0, goff = 0;
      for (int d = 0; d < nd; ++d) {
        loff = loff * p.shape[d] + lstart[d] + idx[d];
        goff = goff * p.global_shape[d] + gstart[d] + idx[d];
      }
      const std::int64_t n = count[nd - 1];
      if (!out.empty() && out.back().local + out.back().n == loff && out.back().global + out.back().n == goff)
        out.back().n += n;
      else
        out.push_back(TensorRun{loff, goff, n});
      int d = nd - 2;
      for (; d >= 0; --d) {
        if (++idx[d] < count[d]) break;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
  }
  std::sort(out.begin(), out.end(), [](const TensorRun& a, const TensorRun& b) { return a.local < b.local; });
  return out;
}

std::uint64_t checksum_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t checksum_terms(const float* x, std::uint64_t global0, std::int64_t n, bool* finite) {
  std::uint64_t sum = 0;
  std::uint32_t bad = 0;  // exponent bits all ones somewhere: NaN or inf
  for (std::int64_t j = 0; j < n; ++j) {
    std::uint32_t bits;
    std::memcpy(&bits, x + j, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    sum += checksum_mix((global0 + static_cast<std::uint64_t>(j)) * 0x9e3779b97f4a7c15ULL + bits);
  }
  if (bad) *finite = false;
  return sum;
}

void DatasetSums::take(int dataset, const float* x, std::uint64_t global0, std::int64_t n) {
  if (n <= 0) return;
  const auto d = static_cast<std::size_t>(dataset);
  bool finite = true;
  sums[d] += checksum_terms(x, global0, n, &finite);
  if (!finite) nonfinite[d] = 1;
  elements[d] += static_cast<std::uint64_t>(n);
}

std::vector<std::uint64_t> DatasetSums::packed() const {
  std::vector<std::uint64_t> acc(sums);
  acc.insert(acc.end(), elements.begin(), elements.end());
  acc.insert(acc.end(), nonfinite.begin(), nonfinite.end());
  return acc;
}

RunChecksums::RunChecksums(std::vector<FileRun> runs, std::size_t datasets)
    : DatasetSums(datasets), runs_(std::move(runs)) {
  std::sort(runs_.begin(), runs_.end(), [](const FileRun& a, const FileRun& b) { return a.src < b.src; });
}

void RunChecksums::add(const char* begin, std::uint64_t bytes) {
  const char* end = begin + bytes;
  // the first run ending after `begin` (runs are disjoint and ordered, so their ends are too)
  auto it = std::upper_bound(runs_.begin(), runs_.end(), begin, [](const char* p, const FileRun& r) {
    return p < reinterpret_cast<const char*>(r.src + r.n);
  });
  for (; it != runs_.end() && reinterpret_cast<const char*>(it->src) < end; ++it) {
    const char* lo = std::max(begin, reinterpret_cast<const char*>(it->src));
    const char* hi = std::min(end, reinterpret_cast<const char*>(it->src + it->n));
    const auto first = static_cast<std::int64_t>((lo - reinterpret_cast<const char*>(it->src)) / sizeof(float));
    take(it->dataset, it->src + first, static_cast<std::uint64_t>(it->global + first),
         static_cast<std::int64_t>((hi - lo) / static_cast<std::ptrdiff_t>(sizeof(float))));
  }
}

void RunChecksums::add_all() {
  for (const FileRun& r : runs_) take(r.dataset, r.src, static_cast<std::uint64_t>(r.global), r.n);
}

namespace {
// A file descriptor, closed on destruction (-1: none).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A buffer aligned for O_DIRECT (std::aligned_alloc; nullptr when that failed).
struct FreeAligned {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeAligned>;
AlignedBuffer aligned_buffer(std::size_t align, std::size_t bytes) {
  return AlignedBuffer(static_cast<char*>(std::aligned_alloc(align, bytes)));
}

// Streams written parts to the disk while later ones are copied: each part's writeback starts at
// once (sync_file_range), and once kWindow newer parts are written, the part is waited for and its
// pages leave the page cache (posix_fadvise DONTNEED; they are on the disk). Dirty memory stays
// at about kWindow parts, the same page-cache pages are reused, and the disk writes overlap the
// copies instead of all waiting for the final fsync (which still makes the file durable).
class WriteBehind {
 public:
  explicit WriteBehind(int fd) : fd_(fd) {}
  void written(off_t at, std::size_t bytes) {
    ::sync_file_range(fd_, at, static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
    parts_.push_back({at, static_cast<off_t>(bytes)});
    if (parts_.size() > kWindow) retire();
  }
  void drain() {
    while (!parts_.empty()) retire();
  }

 private:
  static constexpr std::size_t kWindow = 8;
  void retire() {
    const auto [at, len] = parts_.front();
    parts_.pop_front();
    ::sync_file_range(fd_, at, len, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd_, at, len, POSIX_FADV_DONTNEED);
  }
  int fd_;
  std::deque<std::pair<off_t, off_t>> parts_;
};

// Writes `bytes` bytes from src at `at` of fd, retrying short writes: 0, or the errno of the
// failure (ENOSPC for a write that wrote nothing).
int pwrite_all(int fd, const char* src, std::size_t bytes, off_t at) {
  while (bytes > 0) {
    const ssize_t w = ::pwrite(fd, src, bytes, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : ENOSPC;
    src += w;
    bytes -= static_cast<std::size_t>(w);
    at += w;
  }
  return 0;
}

// The O_DIRECT half of write_runs: a writer thread writes, from four reused 4 KiB-aligned buffers
// of 8 MiB, the aligned blocks that the caller's thread copied into them, so that the copies and
// checksums overlap the disk's writes. A device that refuses a write's alignment (EINVAL) has it
// and every later one written through the page cache instead.
class DirectWriter {
 public:
  static constexpr std::size_t kAlign = 4096, kBuffer = std::size_t{8} << 20;
  static constexpr int kBuffers = 4;
  DirectWriter(int direct_fd, int cached_fd) : direct_(direct_fd), cached_(cached_fd) {
    for (int b = 0; b < kBuffers; ++b) {
      buffers_.push_back(aligned_buffer(kAlign, kBuffer));
      if (!buffers_.back()) throw std::bad_alloc();
    }
    thread_ = std::thread([this] { run(); });
  }
  ~DirectWriter() { finish(); }
  // A buffer to copy up to kBuffer bytes into (waits for one to be free), or nullptr after an error.
  char* acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return errnum_ != 0 || queued_ - written_ < static_cast<std::size_t>(kBuffers); });
    return errnum_ == 0 ? buffers_[queued_ % kBuffers].get() : nullptr;
  }
  // Writes the acquired buffer's first `bytes` bytes (a multiple of kAlign) at `at` (aligned).
  void submit(std::size_t bytes, off_t at) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({bytes, at});
    ++queued_;
    cv_.notify_all();
  }
  // Waits for every submitted write: 0, or the errno of the first that failed.
  int finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    return errnum_;
  }
  std::uint64_t direct_bytes() const { return direct_bytes_; }

 private:
  struct Job {
    std::size_t bytes;
    off_t at;
  };
  void run() {
    for (std::size_t k = 0;; ++k) {
      Job job{};
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return done_ || queued_ > k; });
        if (queued_ <= k) return;
        job = jobs_.front();
        jobs_.pop_front();
      }
      const char* buf = buffers_[k % kBuffers].get();
      int e = 0;
      if (use_direct_) {
        e = pwrite_all(direct_, buf, job.bytes, job.at);
        if (e == EINVAL) use_direct_ = false;
        if (e == 0) direct_bytes_ += job.bytes;
      }
      if (!use_direct_) e = pwrite_all(cached_, buf, job.bytes, job.at);
      std::lock_guard<std::mutex> lock(mu_);
      if (e != 0 && errnum_ == 0) errnum_ = e;
      ++written_;
      cv_.notify_all();
      if (errnum_ != 0) return;
    }
  }
  int direct_, cached_;
  std::vector<AlignedBuffer> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::size_t queued_ = 0, written_ = 0;
  bool done_ = false, use_direct_ = true;
  int errnum_ = 0;
  std::uint64_t direct_bytes_ = 0;
  std::thread thread_;
};
}  // namespace

RunWriteResult write_runs(const std::string& path, const std::vector<FileRun>& runs,
                          const std::vector<std::uint64_t>& dataset_offsets, std::size_t datasets,
                          const RunWriteControl& control) {
  RunWriteResult r;
  static_cast<DatasetSums&>(r) = DatasetSums(datasets);
  Fd cached, direct;
  cached.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (cached.fd < 0) {
    r.error = "cannot open checkpoint file '" + path + "' for writing: " + std::strerror(errno);
    return r;
  }
  const int fd = cached.fd;
  direct.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  std::unique_ptr<DirectWriter> writer;
  if (direct.fd >= 0) {
    try {
      writer = std::make_unique<DirectWriter>(direct.fd, fd);
    } catch (const std::bad_alloc&) {
      writer.reset();  // the page cache then
    }
  }
  constexpr std::size_t kAlign = DirectWriter::kAlign;
  constexpr std::int64_t kPart = DirectWriter::kBuffer / sizeof(float);  // floats per part: 8 MiB
  constexpr std::size_t kMinDirect = std::size_t{64} << 10;              // smaller parts: the page cache
  WriteBehind stream(fd);
  bool writer_failed = false;
  const auto stopped = [&] { return control.stop && control.stop->load(); };
  auto fail = [&](int e) {
    r.error = "writing checkpoint file '" + path + "' failed: " + std::strerror(e) +
              (e == ENOSPC || e == EDQUOT ? " (disk full)" : "");
  };
  for (size_t i = 0; i < runs.size() && r.error.empty(); ++i) {
    const FileRun& run = runs[i];
    if (control.pause_s > 0 && i == runs.size() / 2) {
      const double until = wall_seconds() + control.pause_s;
      while (wall_seconds() < until && !stopped()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (std::int64_t k = 0; k < run.n && r.error.empty(); k += kPart) {
      if (stopped()) {
        r.error = "the write of checkpoint file '" + path + "' was abandoned";
        break;
      }
      const std::int64_t n = std::min(kPart, run.n - k);
      const float* src = run.src + k;
      double t = wall_seconds();
      r.take(run.dataset, src, static_cast<std::uint64_t>(run.global + k), n);
      const double t1 = wall_seconds();
      r.checksum_s += t1 - t;
      const char* bytes = reinterpret_cast<const char*>(src);
      const std::size_t len = static_cast<std::size_t>(n) * sizeof(float);
      const auto at = static_cast<std::uint64_t>(dataset_offsets[run.dataset] +
                                                 static_cast<std::uint64_t>(run.global + k) * sizeof(float));
      // O_DIRECT for the part's whole aligned blocks (its own: no other rank's bytes, no HDF5
      // metadata), the page cache for the unaligned ends and small parts
      const std::uint64_t lo = (at + kAlign - 1) / kAlign * kAlign, hi = (at + len) / kAlign * kAlign;
      int e = 0;
      if (writer && hi > lo && hi - lo >= kMinDirect) {
        if (lo > at) e = pwrite_all(fd, bytes, lo - at, static_cast<off_t>(at));
        if (e == 0 && at + len > hi) e = pwrite_all(fd, bytes + (hi - at), at + len - hi, static_cast<off_t>(hi));
        char* buf = e == 0 ? writer->acquire() : nullptr;
        if (buf) {
          std::memcpy(buf, bytes + (lo - at), hi - lo);
          writer->submit(hi - lo, static_cast<off_t>(lo));
        } else if (e == 0) {
          writer_failed = true;  // its error, below
        }
      } else {
        e = pwrite_all(fd, bytes, len, static_cast<off_t>(at));
        if (e == 0) stream.written(static_cast<off_t>(at), len);
      }
      r.write_s += wall_seconds() - t1;
      if (e != 0) fail(e);
      if (writer_failed) break;
    }
    if (writer_failed) break;
  }
  const double t = wall_seconds();
  if (writer) {
    const int e = writer->finish();
    if (e != 0 && r.error.empty()) fail(e);
    r.direct = true;
    r.direct_bytes = writer->direct_bytes();
  }
  r.write_s += wall_seconds() - t;
  const double t2 = wall_seconds();
  stream.drain();
  if (r.error.empty() && ::fsync(fd) != 0) {
    const int e = errno;
    r.error = "flushing '" + path + "' to the disk failed: " + std::strerror(e) + (e == ENOSPC ? " (disk full)" : "");
  }
  r.fsync_s = wall_seconds() - t2;
  const int c = ::close(cached.fd);
  cached.fd = -1;
  if (c != 0 && r.error.empty()) r.error = "closing checkpoint file '" + path + "' failed: " + std::strerror(errno);
  return r;
}

namespace {
// Reads `bytes` bytes at `at` of fd into dst, retrying short reads: the bytes read (fewer only at
// the end of the file), or -1 with errno set.
std::int64_t pread_all(int fd, char* dst, std::uint64_t bytes, std::uint64_t at) {
  std::uint64_t got = 0;
  while (got < bytes) {
    const ssize_t r = ::pread(fd, dst + got, bytes - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<std::uint64_t>(r);
  }
  return static_cast<std::int64_t>(got);
}

// A window of read_jobs: the file bytes [begin, end) (aligned when dense) and its jobs [first, last).
struct ReadWindow {
  std::uint64_t begin = 0, end = 0;
  std::size_t first = 0, last = 0;
  bool dense = false;
};
}  // namespace

ReadJobsResult read_jobs(const std::string& path, std::vector<ReadJob> jobs, const PlacedFn& placed) {
  constexpr std::uint64_t kAlign = 4096, kWindow = std::uint64_t{16} << 20, kGap = std::uint64_t{256} << 10;
  constexpr int kBuffers = 4, kReaders = 2;
  ReadJobsResult res;
  Fd cached, direct;
  cached.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (cached.fd < 0) {
    res.error = "cannot open '" + path + "': " + std::strerror(errno);
    return res;
  }
  struct stat sb {};
  if (::fstat(cached.fd, &sb) != 0) {
    res.error = "cannot stat '" + path + "': " + std::strerror(errno);
    return res;
  }
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  // jobs of at most a window's bytes less two alignments, each inside the file, ordered by offset
  std::vector<ReadJob> split;
  split.reserve(jobs.size());
  for (const ReadJob& j : jobs) {
    if (j.offset + j.bytes > size) {
      res.error = "the file ends early (truncated): " + std::to_string(size) + " bytes, a tensor's data ends at " +
                  std::to_string(j.offset + j.bytes);
      return res;
    }
    for (std::uint64_t k = 0; k < j.bytes; k += kWindow - 2 * kAlign)
      split.push_back(ReadJob{j.offset + k, std::min(kWindow - 2 * kAlign, j.bytes - k), j.dst + k});
  }
  jobs.clear();
  std::stable_sort(split.begin(), split.end(), [](const ReadJob& a, const ReadJob& b) { return a.offset < b.offset; });
  std::vector<ReadWindow> windows;
  {
    const auto down = [](std::uint64_t x) { return x / kAlign * kAlign; };
    const auto up = [](std::uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
    std::uint64_t useful = 0, reach = 0;  // the window's job bytes; the furthest job end in it
    for (std::size_t i = 0; i < split.size(); ++i) {
      const ReadJob& j = split[i];
      const std::uint64_t b = down(j.offset), e = up(j.offset + j.bytes);
      if (!windows.empty() && std::max(windows.back().end, e) - windows.back().begin <= kWindow &&
          j.offset <= reach + kGap) {
        ReadWindow& w = windows.back();
        w.end = std::max(w.end, e);
        w.last = i + 1;
        useful += j.bytes;
        reach = std::max(reach, j.offset + j.bytes);
      } else {
        if (!windows.empty()) windows.back().dense = 4 * useful >= windows.back().end - windows.back().begin;
        windows.push_back(ReadWindow{b, e, i, i + 1, false});
        useful = j.bytes;
        reach = j.offset + j.bytes;
      }
    }
    if (!windows.empty()) windows.back().dense = 4 * useful >= windows.back().end - windows.back().begin;
  }
  direct.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  res.direct = direct.fd >= 0;
  std::vector<AlignedBuffer> buffers;
  if (res.direct)
    for (int b = 0; b < kBuffers; ++b) {
      buffers.push_back(aligned_buffer(kAlign, kWindow));
      if (!buffers.back()) {
        res.error = "cannot allocate the read buffers";
        return res;
      }
    }
  // Reader thread t reads the windows w = t, t + kReaders, ...: a dense one into buffer
  // w % kBuffers once this thread has copied window w - kBuffers out of it, the others straight
  // into their jobs' destinations; two requests in flight keep the device busier than one.
  std::mutex mu;
  std::condition_variable cv;
  std::size_t copied_upto = 0;  // windows whose bytes are in place
  bool failed = false;
  std::string reader_error;
  std::vector<std::uint8_t> done(windows.size(), 0);       // window w read
  std::vector<std::uint8_t> in_buffer(windows.size(), 0);  // window w's bytes are in its buffer
  std::atomic<bool> use_direct{res.direct};
  std::atomic<std::uint64_t> direct_bytes{0}, cached_bytes{0};
  auto read_windows = [&](std::size_t first) {
    for (std::size_t w = first; w < windows.size(); w += kReaders) {
      const ReadWindow& win = windows[w];
      std::string err;
      bool buffered = false;
      if (use_direct && win.dense) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return failed || copied_upto + kBuffers > w; });
          if (failed) return;
        }
        const std::uint64_t want = std::min(win.end, size) - win.begin;
        const std::int64_t got = pread_all(direct.fd, buffers[w % kBuffers].get(), win.end - win.begin, win.begin);
        if (got < 0 && errno == EINVAL)
          use_direct = false;  // the device wants another alignment: the page cache from here on
        else if (got < 0)
          err = std::strerror(errno);
        else if (static_cast<std::uint64_t>(got) < want)
          err = "the file ends early (truncated)";
        else
          buffered = true;
        if (buffered) direct_bytes += win.end - win.begin;
      }
      if (!buffered && err.empty()) {
        for (std::size_t i = win.first; i < win.last && err.empty(); ++i) {
          const std::int64_t got = pread_all(cached.fd, split[i].dst, split[i].bytes, split[i].offset);
          if (got < 0)
            err = std::strerror(errno);
          else if (static_cast<std::uint64_t>(got) < split[i].bytes)
            err = "the file ends early (truncated)";
          cached_bytes += split[i].bytes;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!err.empty()) {
        if (!failed) reader_error = err;
        failed = true;
      } else {
        in_buffer[w] = buffered ? 1 : 0;
        done[w] = 1;
      }
      cv.notify_all();
      if (failed) return;
    }
  };
  std::vector<std::thread> readers;
  for (std::size_t t = 0; t < static_cast<std::size_t>(kReaders); ++t) readers.emplace_back(read_windows, t);
  for (std::size_t w = 0; w < windows.size(); ++w) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return failed || done[w] != 0; });
      if (failed) break;
    }
    const ReadWindow& win = windows[w];
    if (in_buffer[w]) {
      const char* buf = buffers[w % kBuffers].get();
      for (std::size_t i = win.first; i < win.last; ++i)
        std::memcpy(split[i].dst, buf + (split[i].offset - win.begin), split[i].bytes);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      copied_upto = w + 1;
      cv.notify_all();
    }
    // the buffer is free again; the window's bytes, just copied, are still in the caches
    if (placed)
      for (std::size_t i = win.first; i < win.last; ++i) placed(split[i].dst, split[i].bytes);
  }
  for (std::thread& t : readers) t.join();
  res.direct_bytes = direct_bytes;
  res.cached_bytes = cached_bytes;
  if (failed) res.error = reader_error;
  return res;
}

}  // namespace trident
