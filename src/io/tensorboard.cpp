#include "io/tensorboard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/error.hpp"

namespace trident {

namespace {

constexpr std::uint32_t kCastagnoli = 0x82F63B78u;   // reflected polynomial
constexpr std::size_t kMaxPendingBytes = 64u << 20;  // records waiting for a slow disk

const std::array<std::uint32_t, 256>& crc_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCastagnoli : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event(std::int64_t step, const pb::Message& body, int field) {
  pb::Message ev;
  ev.f64(1, wall_time()).int64(2, step).message(field, body);
  return ev.data();
}

}  // namespace

std::uint32_t crc32c(std::string_view data, std::uint32_t crc) {
  const auto& t = crc_table();
  crc = ~crc;
  for (unsigned char c : data) crc = t[(crc ^ c) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  const std::uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  auto put32 = [&out](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put32(masked_crc32c(std::string_view(out.data(), 8)));
  out.append(data.data(), data.size());
  put32(masked_crc32c(data));
  return out;
}

TbSummary& TbSummary::scalar(const std::string& tag, double v) {
  pb::Message value;
  value.bytes(1, tag).f32(2, static_cast<float>(v));
  msg_.message(1, value);
  ++count_;
  return *this;
}

TbSummary& TbSummary::histogram(const std::string& tag, const std::vector<double>& values, int max_buckets) {
  if (values.empty()) return *this;
  const double lo = *std::min_element(values.begin(), values.end());
  const double hi = *std::max_element(values.begin(), values.end());
  double sum = 0, sum_squares = 0;
  for (double v : values) {
    sum += v;
    sum_squares += v * v;
  }
  const int B = std::max(1, std::min<int>(max_buckets, static_cast<int>(values.size())));
  std::vector<double> limits(static_cast<size_t>(B)), counts(static_cast<size_t>(B), 0.0);
  for (int i = 0; i < B; ++i) limits[static_cast<size_t>(i)] = i + 1 == B ? hi : lo + (hi - lo) * (i + 1) / B;
  for (double v : values) {
    // the first bucket whose upper limit is at or above v (the last one holds the maximum)
    const size_t i = static_cast<size_t>(std::lower_bound(limits.begin(), limits.end(), v) - limits.begin());
    counts[std::min(i, limits.size() - 1)] += 1.0;
  }
  pb::Message h;
  h.f64(1, lo).f64(2, hi).f64(3, static_cast<double>(values.size())).f64(4, sum).f64(5, sum_squares);
  h.packed_f64(6, limits).packed_f64(7, counts);
  pb::Message value;
  value.bytes(1, tag).message(5, h);
  msg_.message(1, value);
  ++count_;
  return *this;
}

TbSummary& TbSummary::text(const std::string& tag, const std::string& text) {
  pb::Message plugin, metadata, tensor, value;
  plugin.bytes(1, "text");
  metadata.message(1, plugin);
  tensor.varint(1, 7);  // DT_STRING; no tensor_shape: a scalar
  tensor.bytes(8, text);
  value.bytes(1, tag).message(8, tensor).message(9, metadata);
  msg_.message(1, value);
  ++count_;
  return *this;
}

struct TensorBoardWriter::State {
  std::string path;
  int fd = -1;
  std::mutex m;
  std::condition_variable wake, drained;
  std::deque<std::string> queue;
  std::size_t pending = 0;
  bool stop = false, done = false, failed = false;
  std::int64_t dropped = 0, unwritten = 0;
  bool warned_slow = false;
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> lk(m);
    for (;;) {
      wake.wait(lk, [&] { return stop || !queue.empty(); });
      if (queue.empty() && stop) break;
      std::string rec = std::move(queue.front());
      queue.pop_front();
      lk.unlock();
      std::string why;
      if (!failed) {
        std::size_t off = 0;
        while (off < rec.size()) {
          const ssize_t w = ::write(fd, rec.data() + off, rec.size() - off);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) {
            why = w < 0 ? std::strerror(errno) : "nothing written";
            break;
          }
          off += static_cast<std::size_t>(w);
        }
      }
      lk.lock();
      pending -= rec.size();
      if (!why.empty() && !failed) {
        failed = true;
        std::cerr << "warning: log.tensorboard_dir: writing '" << path << "' failed: " << why
                  << (why == std::strerror(ENOSPC) ? " (disk full)" : "")
                  << "; no more TensorBoard records are written to it, training goes on" << std::endl;
      }
      if (failed) ++unwritten;
      if (queue.empty()) drained.notify_all();
    }
    done = true;
    drained.notify_all();
  }
};

TensorBoardWriter::TensorBoardWriter(const std::string& dir, std::int64_t first_step, const std::string& deck_text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec && !std::filesystem::is_directory(dir))
    throw Error::one("log.tensorboard_dir: cannot create the directory '" + dir + "': " + ec.message());
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  auto st = std::make_shared<State>();
  const long long now = static_cast<long long>(std::time(nullptr));
  for (int n = 0; st->fd < 0; ++n) {
    std::ostringstream name;
    name << "events.out.tfevents." << now << "." << host << "." << static_cast<long>(getpid()) << "." << n;
    st->path = (std::filesystem::path(dir) / name.str()).string();
    st->fd = ::open(st->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (st->fd < 0 && (errno != EEXIST || n > 1000))
      throw Error::one("log.tensorboard_dir: cannot create '" + st->path + "': " + std::strerror(errno));
  }
  state_ = st;
  state_->thread = std::thread([st] { st->run(); });
  pb::Message ev;
  ev.f64(1, wall_time()).int64(2, 0).bytes(3, "brain.Event:2");
  enqueue(tfrecord(ev.data()));
  pb::Message start;
  start.varint(1, 1);  // SessionLog.START
  enqueue(tfrecord(event(first_step, start, 7)));
  if (!deck_text.empty()) {
    std::string md;  // a Markdown code block: each line indented by four spaces
    std::istringstream in(deck_text);
    for (std::string line; std::getline(in, line);) md += "    " + line + "\n";
    TbSummary s;
    s.text("deck", md);
    write(first_step, s);
  }
}

TensorBoardWriter::~TensorBoardWriter() { close(); }
TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& o) noexcept = default;
TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& o) noexcept {
  if (this != &o) {
    close();
    state_ = std::move(o.state_);
  }
  return *this;
}

const std::string& TensorBoardWriter::path() const {
  static const std::string none;
  return state_ ? state_->path : none;
}

void TensorBoardWriter::enqueue(std::string record) {
  State& s = *state_;
  std::lock_guard<std::mutex> lk(s.m);
  if (s.failed) {
    ++s.unwritten;
    return;
  }
  if (s.pending + record.size() > kMaxPendingBytes) {
    ++s.dropped;
    if (!s.warned_slow) {
      s.warned_slow = true;
      std::cerr << "warning: log.tensorboard_dir: the disk of '" << s.path << "' is slow: " << (kMaxPendingBytes >> 20)
                << " MiB of records wait; newer records are dropped until they are written" << std::endl;
    }
    return;
  }
  s.pending += record.size();
  s.queue.push_back(std::move(record));
  s.wake.notify_one();
}

void TensorBoardWriter::write(std::int64_t step, const TbSummary& summary) {
  if (!state_ || summary.empty()) return;
  enqueue(tfrecord(event(step, summary.message(), 5)));
}

void TensorBoardWriter::close(double wait_s) {
  if (!state_) return;
  std::shared_ptr<State> s = std::move(state_);
  bool finished;
  std::int64_t waiting = 0;
  {
    std::unique_lock<std::mutex> lk(s->m);
    s->stop = true;
    s->wake.notify_one();
    finished = s->drained.wait_for(lk, std::chrono::duration<double>(wait_s), [&] { return s->done; });
    waiting = static_cast<std::int64_t>(s->queue.size());
    if (s->dropped > 0 || s->unwritten > 0 || !finished)
      std::cerr << "warning: log.tensorboard_dir: of this run's TensorBoard records, " << s->dropped
                << " were dropped on a slow disk, " << s->unwritten << " not written after a write failed"
                << (finished ? std::string()
                             : " and " + std::to_string(waiting) + " still wait after " +
                                   std::to_string(static_cast<int>(wait_s)) + " s; they are left")
                << " ('" << s->path << "')" << std::endl;
  }
  if (finished) {
    s->thread.join();
    ::close(s->fd);
  } else {
    s->thread.detach();  // the thread keeps its State alive; the process exits without waiting for it
  }
}

}  // namespace trident
