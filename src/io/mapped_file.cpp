// MappedFile: open, fstat, mmap read-only; the descriptor is closed at once (the mapping keeps
// the file alive).
#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <mutex>
#include <utility>

#include "common/error.hpp"

namespace trident {

namespace detail {
thread_local BusGuard* t_bus_guard = nullptr;

namespace {
void on_sigbus(int, siginfo_t*, void*) {
  if (BusGuard* g = t_bus_guard) siglongjmp(g->env, 1);
  static const char msg[] =
      "error: SIGBUS: a memory-mapped file (token shard, Megatron index or dataset index cache) shrank while the "
      "job reads it\n";
  [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);
  ::_exit(1);
}
}  // namespace

void install_bus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // the jump leaves the handler: SIGBUS must stay unblocked
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
}
}  // namespace detail

MappedFile::MappedFile(const std::string& path) : path_(path) {
  detail::install_bus_handler();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TRIDENT_REQUIRE(fd >= 0, "'" << path << "': cannot open: " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error::all("'" + path + "': cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error::all("'" + path + "': not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    TRIDENT_REQUIRE(p != MAP_FAILED, "'" << path << "': cannot map " << size_ << " bytes: " << std::strerror(e));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace trident
