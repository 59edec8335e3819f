// Communicator implementation: the collectives of communicator.hpp over MPI, or over NCCL
// (comm/nccl.hpp) once enable_device() has run in a CUDA build. Each call marks itself for the
// watchdog (common/progress.hpp); the buffer collectives also add their ring-algorithm bytes to
// the traffic stats. Blocking all-reduces of large buffers go to MPI in chunks of 2^28 elements
// (below INT_MAX); most other MPI calls refuse counts beyond an int with Error::one. Every MPI
// call waits as the job's wait policy says (comm/mpi_job.hpp): the blocking call (spin), or its
// nonblocking form tested with the core given up between tests (yield).
#include "comm/communicator.hpp"

#include "common/device_wait.hpp"
#include "common/progress.hpp"

#include <sched.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "comm/mpi_job.hpp"
#include "common/error.hpp"
#if defined(TRIDENT_ENABLE_CUDA)
#include "comm/nccl.hpp"
#define TRIDENT_NCCL_PATH(stmt) \
  if (nccl_) {                  \
    stmt;                       \
    return;                     \
  }
#else
#define TRIDENT_NCCL_PATH(stmt)
#endif

namespace trident {

Communicator::Communicator(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Communicator Communicator::borrow(MPI_Comm comm) {
  Communicator c(comm);
  c.owned_ = false;
  return c;
}

Communicator Communicator::duplicate(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  TRIDENT_CHECK_MPI(MPI_Comm_dup(comm, &dup));
  return Communicator(dup);
}

Communicator::Communicator(Communicator&& o) noexcept
    : nccl_(std::move(o.nccl_)), comm_(std::exchange(o.comm_, MPI_COMM_NULL)), owned_(o.owned_), rank_(o.rank_),
      size_(o.size_), name_(std::move(o.name_)) {}

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    owned_ = o.owned_;
    rank_ = o.rank_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    nccl_ = std::move(o.nccl_);
  }
  return *this;
}

void Communicator::enable_device() {
#if defined(TRIDENT_ENABLE_CUDA)
  if (!nccl_ && comm_ != MPI_COMM_NULL) nccl_ = detail::nccl_create(comm_, rank_, size_);
#endif
}

int Communicator::max_tag() const {
  void* value = nullptr;
  int flag = 0;
  TRIDENT_CHECK_MPI(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &flag));
  return flag && value ? *static_cast<int*>(value) : 32767;
}

Communicator::~Communicator() { release(); }

void Communicator::release() {
  nccl_.reset();  // before the MPI communicator its id was broadcast over
  if (owned_ && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  comm_ = MPI_COMM_NULL;
}

namespace {
void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw Error::one(std::string("MPI call ") + call + " failed with code " + std::to_string(rc));
}
bool yielding() { return mpi_job::wait_policy() == mpi_job::WaitPolicy::yield; }
// Completes a request: MPI_Wait (spin), or MPI_Test until it is done, giving the core up between
// tests (yield).
void complete(MPI_Request& r) {
  if (r == MPI_REQUEST_NULL) return;
  if (!yielding()) return check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
  for (int done = 0;;) {
    check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    sched_yield();
  }
}
void complete_all(std::vector<MPI_Request>& rs) {
  if (rs.empty()) return;
  const int n = static_cast<int>(rs.size());
  if (!yielding()) return check(MPI_Waitall(n, rs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  for (int done = 0;;) {
    check(MPI_Testall(n, rs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    sched_yield();
  }
}
// One MPI operation under the wait policy: blocking() (spin), or nonblocking(&request) completed
// by complete() (yield). `call` names the blocking call in errors.
template <class Blocking, class Nonblocking>
void run(const char* call, Blocking&& blocking, Nonblocking&& nonblocking) {
  if (!yielding()) return check(blocking(), call);
  MPI_Request r = MPI_REQUEST_NULL;
  check(nonblocking(&r), call);
  complete(r);
}
void allreduce_chunked(float* data, std::int64_t n, MPI_Op op, MPI_Comm comm) {
  TRIDENT_DEVICE_WAIT();
  const std::int64_t chunk = 1 << 28;
  for (std::int64_t off = 0; off < n; off += chunk) {
    const int count = static_cast<int>(std::min(chunk, n - off));
    run(
        "MPI_Allreduce", [&] { return MPI_Allreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, op, comm); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, op, comm, r); });
  }
}
// A scalar or host-array all-reduce under the wait policy.
void allreduce(const void* in, void* out, int n, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  run(
      "MPI_Allreduce", [&] { return MPI_Allreduce(in, out, n, type, op, comm); },
      [&](MPI_Request* r) { return MPI_Iallreduce(in, out, n, type, op, comm, r); });
}
int as_int(std::int64_t n) {
  if (n > 0x7fffffff) throw Error::one("collective of " + std::to_string(n) + " elements exceeds MPI's int count");
  return static_cast<int>(n);
}
// The MPI datatype of one row of `bytes` bytes (the v-collectives count rows), freed with the object.
class RowType {
 public:
  explicit RowType(std::int64_t bytes) {
    TRIDENT_CHECK_MPI(MPI_Type_contiguous(as_int(bytes), MPI_BYTE, &type_));
    TRIDENT_CHECK_MPI(MPI_Type_commit(&type_));
  }
  ~RowType() { MPI_Type_free(&type_); }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};
// MPI's int counts of `rows` per rank, and their displacements (rank after rank).
void counts_and_displacements(const std::vector<std::int64_t>& rows, std::vector<int>& counts,
                              std::vector<int>& displs) {
  counts.resize(rows.size());
  displs.resize(rows.size());
  std::int64_t at = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    counts[r] = as_int(rows[r]);
    displs[r] = as_int(at);
    at += rows[r];
  }
}
}  // namespace

void Communicator::allreduce_sum(float* data, std::int64_t n) const {
  if (size_ == 1 || n == 0) return;
  count("allreduce", 2.0 * (size_ - 1) / size_ * 4.0 * n);
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_allreduce(*nccl_, data, n, false))
  allreduce_chunked(data, n, MPI_SUM, comm_);
}

MPI_Request Communicator::iallreduce_sum(float* data, std::int64_t n) const {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ == 1 || n == 0) return r;
  count("allreduce", 2.0 * (size_ - 1) / size_ * 4.0 * n);
  const progress::InComm in_comm("iallreduce", name_.c_str(), size_);
#if defined(TRIDENT_ENABLE_CUDA)
  if (nccl_) {
    detail::nccl_allreduce(*nccl_, data, n, false);
    return r;
  }
#endif
  TRIDENT_DEVICE_WAIT();
  TRIDENT_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, as_int(n), MPI_FLOAT, MPI_SUM, comm_, &r));
  return r;
}

MPI_Request Communicator::ireduce_sum(float* data, std::int64_t n, int root) const {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ == 1 || n == 0) return r;
  count("reduce", (size_ - 1) * 4.0 * n / size_);
  const progress::InComm in_comm("reduce", name_.c_str(), size_);
#if defined(TRIDENT_ENABLE_CUDA)
  if (nccl_) {
    detail::nccl_reduce(*nccl_, data, n, root);
    return r;
  }
#endif
  TRIDENT_DEVICE_WAIT();
  TRIDENT_CHECK_MPI(
      MPI_Ireduce(rank_ == root ? MPI_IN_PLACE : data, data, as_int(n), MPI_FLOAT, MPI_SUM, root, comm_, &r));
  return r;
}

// Posts ops: one NCCL group on the Kokkos stream (CUDA builds with NCCL; no requests), else
// MPI_Isend / MPI_Irecv after a fence, their requests returned.
std::vector<MPI_Request> Communicator::post_p2p(const std::vector<P2POp>& ops) const {
  std::vector<MPI_Request> requests;
#if defined(TRIDENT_ENABLE_CUDA)
  if (nccl_) {
    detail::nccl_p2p_group(*nccl_, ops);
    return requests;
  }
#endif
  TRIDENT_DEVICE_WAIT();
  requests.assign(ops.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    if (o.send)
      TRIDENT_CHECK_MPI(MPI_Isend(o.buf, as_int(o.n), MPI_FLOAT, o.peer, o.tag, comm_, &requests[i]));
    else
      TRIDENT_CHECK_MPI(MPI_Irecv(o.buf, as_int(o.n), MPI_FLOAT, o.peer, o.tag, comm_, &requests[i]));
  }
  return requests;
}

void Communicator::p2p_group(const std::vector<P2POp>& ops) const {
  if (ops.empty()) return;
  const progress::InComm in_comm(ops[0].send ? "p2p send/recv" : "p2p recv/send", name_.c_str(), size_, ops[0].peer);
  std::vector<MPI_Request> requests = post_p2p(ops);
  wait_all(requests);
}

std::vector<MPI_Request> Communicator::p2p_start(const std::vector<P2POp>& ops) const {
  if (ops.empty()) return {};
  double sent = 0;
  for (const P2POp& o : ops)
    if (o.send) sent += 4.0 * static_cast<double>(o.n);
  count("p2p", sent);
  const progress::InComm in_comm("p2p start", name_.c_str(), size_, ops[0].peer);
  return post_p2p(ops);
}

void Communicator::wait_all(std::vector<MPI_Request>& requests) {
  const progress::InComm in_comm("waitall (non-blocking reductions)", "started", 0);
  complete_all(requests);
  requests.clear();
}

void Communicator::allreduce_max(float* data, std::int64_t n) const {
  if (size_ == 1 || n == 0) return;
  count("allreduce", 2.0 * (size_ - 1) / size_ * 4.0 * n);
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_allreduce(*nccl_, data, n, true))
  allreduce_chunked(data, n, MPI_MAX, comm_);
}

void Communicator::allgather(const float* in, float* out, std::int64_t n) const {
  count("allgather", (size_ - 1) * 4.0 * n);
  const progress::InComm in_comm("allgather", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_allgather_bytes(*nccl_, in, out, 4 * n))
  TRIDENT_DEVICE_WAIT();
  const int c = as_int(n);
  run(
      "MPI_Allgather", [&] { return MPI_Allgather(in, c, MPI_FLOAT, out, c, MPI_FLOAT, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(in, c, MPI_FLOAT, out, c, MPI_FLOAT, comm_, r); });
}

void Communicator::allgather(const std::uint16_t* in, std::uint16_t* out, std::int64_t n) const {
  count("allgather", (size_ - 1) * 2.0 * n);
  const progress::InComm in_comm("allgather", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_allgather_bytes(*nccl_, in, out, 2 * n))
  TRIDENT_DEVICE_WAIT();
  const int c = as_int(n);
  run(
      "MPI_Allgather", [&] { return MPI_Allgather(in, c, MPI_UINT16_T, out, c, MPI_UINT16_T, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(in, c, MPI_UINT16_T, out, c, MPI_UINT16_T, comm_, r); });
}

void Communicator::allgather_in_place(std::uint16_t* buf, std::int64_t n) const {
  if (size_ == 1) return;
  count("allgather", (size_ - 1) * 2.0 * n);
  const progress::InComm in_comm("allgather", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_allgather_bytes(*nccl_, buf + rank_ * n, buf, 2 * n))
  TRIDENT_DEVICE_WAIT();
  const int c = as_int(n);
  run(
      "MPI_Allgather", [&] { return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, MPI_UINT16_T, comm_); },
      [&](MPI_Request* r) {
        return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, MPI_UINT16_T, comm_, r);
      });
}

void Communicator::reduce_scatter(const float* in, float* out, std::int64_t n) const {
  count("reduce_scatter", (size_ - 1) * 4.0 * n);
  const progress::InComm in_comm("reduce_scatter", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_reduce_scatter(*nccl_, in, out, n))
  TRIDENT_DEVICE_WAIT();
  const int c = as_int(n);
  run(
      "MPI_Reduce_scatter_block", [&] { return MPI_Reduce_scatter_block(in, out, c, MPI_FLOAT, MPI_SUM, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(in, out, c, MPI_FLOAT, MPI_SUM, comm_, r); });
}

void Communicator::reduce_scatter_in_place(float* buf, std::int64_t n) const {
  if (size_ == 1) return;
  count("reduce_scatter", (size_ - 1) * 4.0 * n);
  const progress::InComm in_comm("reduce_scatter", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_reduce_scatter(*nccl_, buf, buf + rank_ * n, n))  // NCCL's in-place form
  TRIDENT_DEVICE_WAIT();
  // MPI_IN_PLACE leaves this rank's block at the start of buf: move it to its place.
  const int c = as_int(n);
  run(
      "MPI_Reduce_scatter_block",
      [&] { return MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, c, MPI_FLOAT, MPI_SUM, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, c, MPI_FLOAT, MPI_SUM, comm_, r); });
  if (rank_ > 0) {
    using Unmanaged = Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space,
                                   Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(Unmanaged(buf + rank_ * n, static_cast<size_t>(n)), Unmanaged(buf, static_cast<size_t>(n)));
    TRIDENT_DEVICE_WAIT();
  }
}

void Communicator::allgather_in_place(float* buf, std::int64_t n) const {
  if (size_ == 1) return;
  count("allgather", (size_ - 1) * 4.0 * n);
  const progress::InComm in_comm("allgather", name_.c_str(), size_);
  TRIDENT_NCCL_PATH(detail::nccl_allgather_bytes(*nccl_, buf + rank_ * n, buf, 4 * n))
  TRIDENT_DEVICE_WAIT();
  const int c = as_int(n);
  run(
      "MPI_Allgather", [&] { return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, MPI_FLOAT, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, MPI_FLOAT, comm_, r); });
}

double Communicator::allreduce_sum(double v) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  double out = v;
  if (size_ > 1) allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, comm_);
  return out;
}

double Communicator::allreduce_max(double v) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  double out = v;
  if (size_ > 1) allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm_);
  return out;
}

std::int64_t Communicator::allreduce_sum(std::int64_t v) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  std::int64_t out = v;
  if (size_ > 1) allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, comm_);
  return out;
}

std::int64_t Communicator::allreduce_min(std::int64_t v) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  std::int64_t out = v;
  if (size_ > 1) allreduce(&v, &out, 1, MPI_INT64_T, MPI_MIN, comm_);
  return out;
}

void Communicator::allreduce_sum(std::int64_t* data, std::int64_t n) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  if (size_ > 1) allreduce(MPI_IN_PLACE, data, as_int(n), MPI_INT64_T, MPI_SUM, comm_);
}

void Communicator::allreduce_sum(double* data, std::int64_t n) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  if (size_ > 1) allreduce(MPI_IN_PLACE, data, as_int(n), MPI_DOUBLE, MPI_SUM, comm_);
}

void Communicator::allreduce_sum(std::uint64_t* data, std::int64_t n) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  if (size_ > 1) allreduce(MPI_IN_PLACE, data, as_int(n), MPI_UINT64_T, MPI_SUM, comm_);
}

std::int64_t Communicator::exscan_sum(std::int64_t v) const {
  const progress::InComm in_comm("exscan", name_.c_str(), size_);
  std::int64_t out = 0;
  run(
      "MPI_Exscan", [&] { return MPI_Exscan(&v, &out, 1, MPI_INT64_T, MPI_SUM, comm_); },
      [&](MPI_Request* r) { return MPI_Iexscan(&v, &out, 1, MPI_INT64_T, MPI_SUM, comm_, r); });
  return rank_ == 0 ? 0 : out;  // MPI leaves rank 0's result undefined
}

void Communicator::alltoall(const std::int64_t* send, std::int64_t* recv, std::int64_t n) const {
  const progress::InComm in_comm("alltoall", name_.c_str(), size_);
  const int c = as_int(n);
  run(
      "MPI_Alltoall", [&] { return MPI_Alltoall(send, c, MPI_INT64_T, recv, c, MPI_INT64_T, comm_); },
      [&](MPI_Request* r) { return MPI_Ialltoall(send, c, MPI_INT64_T, recv, c, MPI_INT64_T, comm_, r); });
}

void Communicator::alltoallv(const void* send, const std::vector<std::int64_t>& send_rows, void* recv,
                             const std::vector<std::int64_t>& recv_rows, std::int64_t row_bytes) const {
  TRIDENT_REQUIRE(static_cast<int>(send_rows.size()) == size_ && static_cast<int>(recv_rows.size()) == size_,
                  "internal: alltoallv over " << size_ << " ranks with " << send_rows.size() << " send and "
                                              << recv_rows.size() << " receive counts");
  const progress::InComm in_comm("alltoallv", name_.c_str(), size_);
  std::int64_t sent = 0;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) sent += send_rows[static_cast<size_t>(r)];
  count("alltoallv", static_cast<double>(sent * row_bytes));
#if defined(TRIDENT_ENABLE_CUDA)
  if (nccl_) {
    detail::nccl_alltoallv_bytes(*nccl_, send, send_rows, recv, recv_rows, row_bytes);
    return;
  }
#endif
  TRIDENT_DEVICE_WAIT();
  const RowType row(row_bytes);
  std::vector<int> sc, sd, rc, rd;
  counts_and_displacements(send_rows, sc, sd);
  counts_and_displacements(recv_rows, rc, rd);
  run(
      "MPI_Alltoallv",
      [&] {
        return MPI_Alltoallv(send, sc.data(), sd.data(), row.get(), recv, rc.data(), rd.data(), row.get(), comm_);
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, sc.data(), sd.data(), row.get(), recv, rc.data(), rd.data(), row.get(), comm_, r);
      });
}

void Communicator::allgatherv(const void* send, void* recv, const std::vector<std::int64_t>& rows,
                              std::int64_t row_bytes) const {
  TRIDENT_REQUIRE(static_cast<int>(rows.size()) == size_,
                  "internal: allgatherv over " << size_ << " ranks with " << rows.size() << " counts");
  const progress::InComm in_comm("allgatherv", name_.c_str(), size_);
  std::int64_t total = 0;
  for (auto r : rows) total += r;
  count("allgatherv", static_cast<double>((total - rows[static_cast<size_t>(rank_)]) * row_bytes));
#if defined(TRIDENT_ENABLE_CUDA)
  if (nccl_) {
    detail::nccl_allgatherv_bytes(*nccl_, send, recv, rows, row_bytes);
    return;
  }
#endif
  TRIDENT_DEVICE_WAIT();
  const RowType row(row_bytes);
  std::vector<int> rc, rd;
  counts_and_displacements(rows, rc, rd);
  const int mine = rc[static_cast<size_t>(rank_)];
  run(
      "MPI_Allgatherv",
      [&] { return MPI_Allgatherv(send, mine, row.get(), recv, rc.data(), rd.data(), row.get(), comm_); },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(send, mine, row.get(), recv, rc.data(), rd.data(), row.get(), comm_, r);
      });
}

void Communicator::reduce_scatter_v(const float* in, float* out, const std::vector<std::int64_t>& counts) const {
  TRIDENT_REQUIRE(static_cast<int>(counts.size()) == size_,
                  "internal: reduce_scatter_v over " << size_ << " ranks with " << counts.size() << " counts");
  const progress::InComm in_comm("reduce_scatter_v", name_.c_str(), size_);
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  count("reduce_scatter_v", 4.0 * static_cast<double>(total - counts[static_cast<size_t>(rank_)]));
#if defined(TRIDENT_ENABLE_CUDA)
  if (nccl_) {
    detail::nccl_reduce_scatter_v(*nccl_, in, out, counts);
    return;
  }
#endif
  TRIDENT_DEVICE_WAIT();
  std::vector<int> rc(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) rc[r] = as_int(counts[r]);
  run(
      "MPI_Reduce_scatter", [&] { return MPI_Reduce_scatter(in, out, rc.data(), MPI_FLOAT, MPI_SUM, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce_scatter(in, out, rc.data(), MPI_FLOAT, MPI_SUM, comm_, r); });
}

void Communicator::allgather(const std::int32_t* in, std::int32_t* out, std::int64_t n) const {
  const progress::InComm in_comm("allgather", name_.c_str(), size_);
  const int c = as_int(n);
  run(
      "MPI_Allgather", [&] { return MPI_Allgather(in, c, MPI_INT32_T, out, c, MPI_INT32_T, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(in, c, MPI_INT32_T, out, c, MPI_INT32_T, comm_, r); });
}

void Communicator::barrier() const {
  const progress::InComm in_comm("barrier", name_.c_str(), size_);
  run(
      "MPI_Barrier", [&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
}

bool Communicator::barrier_within(double seconds) const {
  MPI_Request req = MPI_REQUEST_NULL;
  TRIDENT_CHECK_MPI(MPI_Ibarrier(comm_, &req));
  const double start = MPI_Wtime();
  int done = 0;
  while (true) {
    TRIDENT_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done || MPI_Wtime() - start > seconds) return done != 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void Communicator::send(const float* buf, std::int64_t n, int peer, int tag) const {
  const int c = as_int(n);
  run(
      "MPI_Send", [&] { return MPI_Send(buf, c, MPI_FLOAT, peer, tag, comm_); },
      [&](MPI_Request* r) { return MPI_Isend(buf, c, MPI_FLOAT, peer, tag, comm_, r); });
}

void Communicator::recv(float* buf, std::int64_t n, int peer, int tag) const {
  const int c = as_int(n);
  run(
      "MPI_Recv", [&] { return MPI_Recv(buf, c, MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE); },
      [&](MPI_Request* r) { return MPI_Irecv(buf, c, MPI_FLOAT, peer, tag, comm_, r); });
}

MPI_Request Communicator::isend(const float* buf, std::int64_t n, int peer, int tag) const {
  MPI_Request r = MPI_REQUEST_NULL;
  TRIDENT_CHECK_MPI(MPI_Isend(buf, static_cast<int>(n), MPI_FLOAT, peer, tag, comm_, &r));
  return r;
}

void Communicator::wait(MPI_Request& request) { complete(request); }

double Communicator::allreduce_min(double v) const {
  const progress::InComm in_comm("allreduce", name_.c_str(), size_);
  double out = v;
  if (size_ > 1) allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MIN, comm_);
  return out;
}

std::vector<double> Communicator::gatherv_to_root(const std::vector<double>& mine, std::vector<int>* lengths) const {
  const progress::InComm in_comm("gather", name_.c_str(), size_);
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank_ == 0 ? static_cast<std::size_t>(size_) : 0), offs(lens.size(), 0);
  run(
      "MPI_Gather", [&] { return MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_); },
      [&](MPI_Request* r) { return MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_, r); });
  std::size_t total = 0;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    offs[r] = static_cast<int>(total);
    total += static_cast<std::size_t>(lens[r]);
  }
  std::vector<double> all(total);
  run(
      "MPI_Gatherv",
      [&] {
        return MPI_Gatherv(mine.data(), len, MPI_DOUBLE, all.data(), lens.data(), offs.data(), MPI_DOUBLE, 0, comm_);
      },
      [&](MPI_Request* r) {
        return MPI_Igatherv(mine.data(), len, MPI_DOUBLE, all.data(), lens.data(), offs.data(), MPI_DOUBLE, 0, comm_,
                            r);
      });
  if (lengths) *lengths = lens;
  return all;
}

std::string Communicator::broadcast_text(const std::string& text, int root) const {
  const progress::InComm in_comm("broadcast", name_.c_str(), size_);
  std::string out = rank_ == root ? text : std::string();
  std::int64_t n = static_cast<std::int64_t>(out.size());
  run(
      "MPI_Bcast", [&] { return MPI_Bcast(&n, 1, MPI_INT64_T, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ibcast(&n, 1, MPI_INT64_T, root, comm_, r); });
  if (n > 0x7fffffff) throw Error::one("broadcast of " + std::to_string(n) + " bytes: more than MPI's int count");
  out.resize(static_cast<std::size_t>(n));
  const int c = static_cast<int>(n);
  run(
      "MPI_Bcast", [&] { return MPI_Bcast(out.data(), c, MPI_CHAR, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ibcast(out.data(), c, MPI_CHAR, root, comm_, r); });
  return out;
}

void Communicator::broadcast_waiting(std::vector<std::int64_t>& values, int root, int poll_us) const {
  std::int64_t n = static_cast<std::int64_t>(values.size());
  MPI_Request req;
  TRIDENT_CHECK_MPI(MPI_Ibcast(&n, 1, MPI_INT64_T, root, comm_, &req));
  for (int done = 0;;) {
    TRIDENT_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
  }
  if (n > 0x7fffffff) throw Error::one("broadcast of " + std::to_string(n) + " values: more than MPI's int count");
  values.resize(static_cast<std::size_t>(n));
  const progress::InComm in_comm("broadcast", name_.c_str(), size_);
  const int c = static_cast<int>(n);
  run(
      "MPI_Bcast", [&] { return MPI_Bcast(values.data(), c, MPI_INT64_T, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ibcast(values.data(), c, MPI_INT64_T, root, comm_, r); });
}

std::vector<std::string> Communicator::allgather_text(const std::string& mine) const {
  const progress::InComm in_comm("allgather", name_.c_str(), size_);
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size_)), offs(static_cast<std::size_t>(size_), 0);  // (size)
  run(
      "MPI_Allgather", [&] { return MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, r); });
  for (int r = 1; r < size_; ++r) offs[r] = offs[r - 1] + lens[r - 1];
  std::string all(static_cast<std::size_t>(offs[size_ - 1] + lens[size_ - 1]), '\0');
  run(
      "MPI_Allgatherv",
      [&] { return MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm_); },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm_, r);
      });
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<std::size_t>(offs[r]), lens[r]));
  return out;
}

std::string comm_library_versions() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string mpi(buf, static_cast<std::size_t>(len));
  const auto eol = mpi.find('\n');
  std::string out = "MPI: " + mpi.substr(0, eol);
#if defined(TRIDENT_ENABLE_CUDA)
  out += "\nNCCL: " + detail::nccl_version_string();
#endif
  return out;
}

}  // namespace trident
