// Communicator: an owned MPI communicator (freed on destruction) with the collectives the core
// uses. Host build: MPI on host memory. (The CUDA build adds an NCCL communicator created from
// an id broadcast over this MPI communicator; device buffers then go through NCCL.)
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trident {

namespace detail {
struct NcclComm;
}

class Communicator {
 public:
  Communicator() = default;
  // Takes ownership of comm unless it is MPI_COMM_WORLD/MPI_COMM_SELF.
  explicit Communicator(MPI_Comm comm);
  // A view of a communicator someone else owns (never freed by this object): code handed a bare
  // MPI_Comm runs its collectives through here, with the same error checks.
  static Communicator borrow(MPI_Comm comm);
  // A new communicator over the same ranks (MPI_Comm_dup), owned: traffic on it never matches
  // traffic on `comm` (collective over comm).
  static Communicator duplicate(MPI_Comm comm);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  ~Communicator();

  MPI_Comm get() const { return comm_; }
  // CUDA builds: creates this group's NCCL communicator (collective over the group; every rank
  // must enable its groups in the same order). From then on the collectives on device buffers
  // below run through NCCL on the Kokkos stream. Host builds: nothing to do.
  void enable_device();
  bool device_enabled() const { return static_cast<bool>(nccl_); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's name in reports ("tp", "dp", ...; common/progress.hpp).
  void set_name(const std::string& name) { name_ = name; }
  const std::string& name() const { return name_; }
  // The largest message tag the MPI library accepts on this group (its MPI_TAG_UB attribute; the
  // standard guarantees only 32767).
  int max_tag() const;

  // In-place sum / max over the group of a buffer data (n) in the default memory space.
  void allreduce_sum(float* data, std::int64_t n) const;
  void allreduce_max(float* data, std::int64_t n) const;
  // out (size() * n) = the n values of every rank, in rank order.
  void allgather(const float* in, float* out, std::int64_t n) const;
  // The same for 16-bit words (bf16 / fp16 activations and parameters).
  void allgather(const std::uint16_t* in, std::uint16_t* out, std::int64_t n) const;
  void allgather_in_place(std::uint16_t* buf, std::int64_t n) const;
  // out (n) = sum over ranks of in[rank() * n, (rank() + 1) * n).
  void reduce_scatter(const float* in, float* out, std::int64_t n) const;
  // In place over buf (size() * n): on return buf[rank() * n, (rank() + 1) * n) holds the sum over
  // ranks of that block (the other blocks are left undefined).
  void reduce_scatter_in_place(float* buf, std::int64_t n) const;
  // In place over buf (size() * n): every rank contributes its block buf[rank() * n, ...) and
  // receives all of them.
  void allgather_in_place(float* buf, std::int64_t n) const;
  // Non-blocking in-place sum of a device buffer data (n); complete with wait_all. CUDA builds
  // with NCCL enqueue it on the Kokkos stream (ordered with the kernels) and return
  // MPI_REQUEST_NULL.
  MPI_Request iallreduce_sum(float* data, std::int64_t n) const;
  static void wait_all(std::vector<MPI_Request>& requests);
  // Non-blocking in-place sum to `root` only (its buffer receives the sum; the others' buffers
  // are left as they were). NCCL in CUDA builds, as above.
  MPI_Request ireduce_sum(float* data, std::int64_t n, int root) const;
  // Point-to-point messages of device float buffers, executed as one group that completes as a
  // whole (ncclGroupStart/End with ncclSend/ncclRecv in CUDA builds, which have no tags: the
  // messages between two ranks match in order; MPI_Isend/Irecv + MPI_Waitall otherwise).
  struct P2POp {
    bool send;
    float* buf;  // (n) floats in the default memory space
    std::int64_t n;
    int peer, tag;
  };
  void p2p_group(const std::vector<P2POp>& ops) const;
  // The same messages started and not waited for: the caller computes meanwhile and completes
  // them with wait_all(returned requests) before it touches the buffers. Host builds: MPI_Isend /
  // MPI_Irecv after a fence (the buffers are complete when posted). CUDA builds with NCCL: one
  // group enqueued on the Kokkos stream (ordered with the kernels before and after it), and no
  // request to wait for. Counted as "p2p" traffic (the bytes this rank sends).
  std::vector<MPI_Request> p2p_start(const std::vector<P2POp>& ops) const;
  // Single point-to-point messages of float buffers over MPI (the pipeline's ungrouped
  // schedules). wait completes an isend's request (nothing for MPI_REQUEST_NULL).
  void send(const float* buf, std::int64_t n, int peer, int tag) const;
  void recv(float* buf, std::int64_t n, int peer, int tag) const;
  MPI_Request isend(const float* buf, std::int64_t n, int peer, int tag) const;
  static void wait(MPI_Request& request);
  double allreduce_sum(double v) const;
  double allreduce_max(double v) const;
  double allreduce_min(double v) const;
  std::int64_t allreduce_sum(std::int64_t v) const;
  std::int64_t allreduce_min(std::int64_t v) const;
  // In-place sums over the group of host integer and double arrays data (n).
  void allreduce_sum(std::int64_t* data, std::int64_t n) const;
  void allreduce_sum(double* data, std::int64_t n) const;
  void allreduce_sum(std::uint64_t* data, std::int64_t n) const;
  // The sum of v over the ranks below this one (0 on rank 0).
  std::int64_t exscan_sum(std::int64_t v) const;
  // Gathers `n` ints from every rank into out (size n * size()) on every rank.
  void allgather(const std::int32_t* in, std::int32_t* out, std::int64_t n) const;
  // All-to-all of host integers: send (size() * n) holds n values for each rank in rank order;
  // recv (size() * n) receives rank r's n values for this rank at [r * n, (r + 1) * n).
  void alltoall(const std::int64_t* send, std::int64_t* recv, std::int64_t n) const;
  // All-to-all of rows of `row_bytes` bytes in the default memory space (the MoE token
  // dispatch): send holds send_rows[r] rows for rank r, rank after rank; recv receives
  // recv_rows[r] rows from rank r, rank after rank. A rank may send or receive no rows. MPI
  // (one contiguous datatype per row) in host builds; NCCL grouped send/receive on the Kokkos
  // stream in CUDA builds.
  void alltoallv(const void* send, const std::vector<std::int64_t>& send_rows, void* recv,
                 const std::vector<std::int64_t>& recv_rows, std::int64_t row_bytes) const;
  // All-gather of rows of `row_bytes` bytes, rows[r] from rank r (this rank's: rows[rank()]),
  // into recv rank after rank (expert tensor parallelism). MPI_Allgatherv on the host; NCCL
  // broadcasts from every rank as one group in CUDA builds.
  void allgatherv(const void* send, void* recv, const std::vector<std::int64_t>& rows, std::int64_t row_bytes) const;
  // Reduce-scatter of floats in blocks of unequal sizes: in holds counts[r] floats for each rank r,
  // rank after rank; out (counts[rank()]) receives the sum over ranks of this rank's block.
  // MPI_Reduce_scatter on the host; NCCL reduces to every rank as one group in CUDA builds.
  void reduce_scatter_v(const float* in, float* out, const std::vector<std::int64_t>& counts) const;
  void barrier() const;
  // A barrier that gives up: true when every rank of the group entered it within `seconds`,
  // false otherwise (the barrier is then left pending; the caller is about to end the job).
  bool barrier_within(double seconds) const;
  // Rank 0 receives every rank's `mine` (of any length), rank after rank, and each rank's length
  // in *lengths when given; the other ranks receive an empty vector (host values: reports).
  std::vector<double> gatherv_to_root(const std::vector<double>& mine, std::vector<int>* lengths = nullptr) const;
  // Rank root's text, on every rank.
  std::string broadcast_text(const std::string& text, int root = 0) const;
  // Every rank's text, in rank order, on every rank.
  std::vector<std::string> allgather_text(const std::string& mine) const;
  // Rank root's `values` (of any length) on every rank. The other ranks wait for it without
  // spinning a core: a nonblocking broadcast of the length, tested every poll_us microseconds
  // (a server's ranks waiting for the next request: serve_gpt).
  void broadcast_waiting(std::vector<std::int64_t>& values, int root = 0, int poll_us = 200) const;

  // Traffic accounting, per collective kind: calls and the bytes each rank sends with ring
  // algorithms -- all-reduce of n bytes: 2 (p-1)/p n; all-gather / reduce-scatter of a total of
  // n bytes: (p-1)/p n each (so an all-reduce costs what its reduce-scatter + all-gather cost).
  struct Stats {
    std::int64_t calls = 0;
    double bytes = 0;
  };
  const Stats& stats(const std::string& kind) const { return stats_[kind]; }
  void reset_stats() const { stats_.clear(); }
  const std::map<std::string, Stats>& all_stats() const { return stats_; }

 private:
  void count(const char* kind, double bytes) const {
    auto& s = stats_[kind];
    ++s.calls;
    s.bytes += bytes;
  }
  std::vector<MPI_Request> post_p2p(const std::vector<P2POp>& ops) const;
  mutable std::map<std::string, Stats> stats_;
  std::shared_ptr<detail::NcclComm> nccl_;
  void release();
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = true;  // false for borrow()ed views
  int rank_ = 0, size_ = 1;
  std::string name_ = "world";
};

// The communication libraries this build runs on, one per line: the MPI library's own version
// string (first line) and, in CUDA builds, NCCL's. Callable before MPI_Init.
std::string comm_library_versions();

}  // namespace trident
