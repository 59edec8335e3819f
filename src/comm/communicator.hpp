// Communicator: an owned MPI communicator (freed on destruction) with the collectives the core
// uses. Host build: MPI on host memory. (The CUDA build adds an NCCL communicator created from
// an id broadcast over this MPI communicator; device buffers then go through NCCL.)
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

namespace trident {

class Communicator {
 public:
  Communicator() = default;
  // Takes ownership of comm unless it is MPI_COMM_WORLD/MPI_COMM_SELF.
  explicit Communicator(MPI_Comm comm);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  ~Communicator();

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // In-place sum over the group of a buffer in the default memory space.
  void allreduce_sum(float* data, std::int64_t n) const;
  double allreduce_sum(double v) const;
  double allreduce_max(double v) const;
  std::int64_t allreduce_sum(std::int64_t v) const;
  // Gathers `n` ints from every rank into out (size n * size()) on every rank.
  void allgather(const std::int32_t* in, std::int32_t* out, std::int64_t n) const;
  void barrier() const;

 private:
  void release();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace trident
