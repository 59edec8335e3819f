// NCCL communicators of the CUDA backend (compiled only with TRIDENT_ENABLE_CUDA; nccl_cuda.cpp).
// Each Communicator of a device build owns one NCCL communicator of the same ranks, created from
// a unique id that its rank 0 broadcasts over the MPI communicator. Collectives on device
// buffers then run on the Kokkos CUDA stream; host scalars keep going through MPI. Errors are
// reported with the NCCL call, file and line.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace trident::detail {

struct NcclComm;  // defined in nccl_cuda.cpp

std::shared_ptr<NcclComm> nccl_create(MPI_Comm comm, int rank, int size);
void nccl_allreduce(const NcclComm& c, float* data, std::int64_t n, bool max);
// out (size * bytes) = every rank's `bytes` from in; in may be out + rank * bytes (in place)
void nccl_allgather_bytes(const NcclComm& c, const void* in, void* out, std::int64_t bytes);
// the sends and receives of one pipeline step, as one NCCL group
void nccl_p2p_group(const NcclComm& c, const std::vector<Communicator::P2POp>& ops);
// rows of `row_bytes` bytes to and from every rank (Communicator::alltoallv), as one NCCL group
void nccl_alltoallv_bytes(const NcclComm& c, const void* send, const std::vector<std::int64_t>& send_rows, void* recv,
                          const std::vector<std::int64_t>& recv_rows, std::int64_t row_bytes);
// rows[r] rows of `row_bytes` bytes from every rank r, rank after rank (Communicator::allgatherv)
void nccl_allgatherv_bytes(const NcclComm& c, const void* send, void* recv, const std::vector<std::int64_t>& rows,
                           std::int64_t row_bytes);
// out (counts[rank]) = sum over ranks of their block `rank` of in (Communicator::reduce_scatter_v)
void nccl_reduce_scatter_v(const NcclComm& c, const float* in, float* out, const std::vector<std::int64_t>& counts);
// data (n) on root = sum over ranks of data (in place)
void nccl_reduce(const NcclComm& c, float* data, std::int64_t n, int root);
// out (n) = sum over ranks of in[rank * n, (rank + 1) * n); out may be in + rank * n (in place)
void nccl_reduce_scatter(const NcclComm& c, const float* in, float* out, std::int64_t n);
// "2.28.9" (the library loaded at run time)
std::string nccl_version_string();

}  // namespace trident::detail
