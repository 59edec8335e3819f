// NCCL communicators and collectives (CUDA builds only): the detail:: functions of nccl.hpp.
// nccl_create broadcasts rank 0's ncclUniqueId over the MPI communicator and initialises the
// NCCL rank; every collective and point-to-point group is enqueued on the Kokkos CUDA stream.
// A failing NCCL call throws Error::one naming the call, file and line (TRIDENT_NCCL).
#include <cuda_runtime.h>
#include <nccl.h>

#include <Kokkos_Core.hpp>
#include <sstream>

#include "comm/nccl.hpp"
#include "common/error.hpp"

#define TRIDENT_NCCL(call)                                                                                         \
  do {                                                                                                             \
    ncclResult_t trident_r_ = (call);                                                                              \
    if (trident_r_ != ncclSuccess) {                                                                               \
      std::ostringstream trident_os_;                                                                              \
      trident_os_ << "NCCL call " #call " failed: " << ncclGetErrorString(trident_r_) << " at " << __FILE__ << ":" \
                  << __LINE__;                                                                                     \
      throw ::trident::Error::one(trident_os_.str());                                                              \
    }                                                                                                              \
  } while (0)

namespace trident::detail {

struct NcclComm {
  ncclComm_t comm = nullptr;
  ~NcclComm() {
    if (comm) ncclCommDestroy(comm);
  }
};

namespace {
cudaStream_t stream() { return Kokkos::Cuda().cuda_stream(); }
}  // namespace

std::shared_ptr<NcclComm> nccl_create(MPI_Comm comm, int rank, int size) {
  ncclUniqueId id;
  if (rank == 0) TRIDENT_NCCL(ncclGetUniqueId(&id));
  TRIDENT_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  auto c = std::make_shared<NcclComm>();
  TRIDENT_NCCL(ncclCommInitRank(&c->comm, size, id, rank));
  return c;
}

void nccl_allreduce(const NcclComm& c, float* data, std::int64_t n, bool max) {
  TRIDENT_NCCL(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, max ? ncclMax : ncclSum, c.comm, stream()));
}

void nccl_allgather_bytes(const NcclComm& c, const void* in, void* out, std::int64_t bytes) {
  TRIDENT_NCCL(ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, c.comm, stream()));
}

void nccl_p2p_group(const NcclComm& c, const std::vector<Communicator::P2POp>& ops) {
  TRIDENT_NCCL(ncclGroupStart());
  for (const auto& o : ops) {
    if (o.send)
      TRIDENT_NCCL(ncclSend(o.buf, static_cast<size_t>(o.n), ncclFloat, o.peer, c.comm, stream()));
    else
      TRIDENT_NCCL(ncclRecv(o.buf, static_cast<size_t>(o.n), ncclFloat, o.peer, c.comm, stream()));
  }
  TRIDENT_NCCL(ncclGroupEnd());
}

void nccl_alltoallv_bytes(const NcclComm& c, const void* send, const std::vector<std::int64_t>& send_rows, void* recv,
                          const std::vector<std::int64_t>& recv_rows, std::int64_t row_bytes) {
  const auto* in = static_cast<const std::uint8_t*>(send);
  auto* out = static_cast<std::uint8_t*>(recv);
  TRIDENT_NCCL(ncclGroupStart());
  for (size_t r = 0; r < send_rows.size(); ++r) {
    const size_t sb = static_cast<size_t>(send_rows[r] * row_bytes), rb = static_cast<size_t>(recv_rows[r] * row_bytes);
    if (sb > 0) TRIDENT_NCCL(ncclSend(in, sb, ncclUint8, static_cast<int>(r), c.comm, stream()));
    if (rb > 0) TRIDENT_NCCL(ncclRecv(out, rb, ncclUint8, static_cast<int>(r), c.comm, stream()));
    in += sb;
    out += rb;
  }
  TRIDENT_NCCL(ncclGroupEnd());
}

void nccl_allgatherv_bytes(const NcclComm& c, const void* send, void* recv, const std::vector<std::int64_t>& rows,
                           std::int64_t row_bytes) {
  auto* out = static_cast<std::uint8_t*>(recv);
  TRIDENT_NCCL(ncclGroupStart());
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t bytes = static_cast<size_t>(rows[r] * row_bytes);
    if (bytes > 0) TRIDENT_NCCL(ncclBroadcast(send, out, bytes, ncclUint8, static_cast<int>(r), c.comm, stream()));
    out += bytes;
  }
  TRIDENT_NCCL(ncclGroupEnd());
}

void nccl_reduce_scatter_v(const NcclComm& c, const float* in, float* out, const std::vector<std::int64_t>& counts) {
  TRIDENT_NCCL(ncclGroupStart());
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > 0)
      TRIDENT_NCCL(ncclReduce(in, out, static_cast<size_t>(counts[r]), ncclFloat, ncclSum, static_cast<int>(r), c.comm,
                              stream()));
    in += counts[r];
  }
  TRIDENT_NCCL(ncclGroupEnd());
}

void nccl_reduce(const NcclComm& c, float* data, std::int64_t n, int root) {
  TRIDENT_NCCL(ncclReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, root, c.comm, stream()));
}

void nccl_reduce_scatter(const NcclComm& c, const float* in, float* out, std::int64_t n) {
  TRIDENT_NCCL(ncclReduceScatter(in, out, static_cast<size_t>(n), ncclFloat, ncclSum, c.comm, stream()));
}

std::string nccl_version_string() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace trident::detail
