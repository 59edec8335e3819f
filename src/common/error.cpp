// Collective error agreement (agree_or_throw, declared in error.hpp): an MPI_MIN all-reduce
// finds the lowest rank with a local error, that rank broadcasts its message, and every rank
// throws it as Error::all. Marked for the watchdog (common/progress.hpp) while it runs.
#include "common/error.hpp"

#include "common/progress.hpp"

#include <vector>

namespace trident {

void agree_or_throw(MPI_Comm comm, const std::string& local_error) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const progress::InComm in_comm("agreement on errors (allreduce)", "world", size);
  int bad = local_error.empty() ? -1 : rank;
  int first_bad = -1;
  // The lowest failing rank (or -1) via MAX over (-1 | rank) would pick the highest; use MIN
  // over (rank | INT_MAX).
  int mine = bad < 0 ? 0x7fffffff : bad;
  MPI_Allreduce(&mine, &first_bad, 1, MPI_INT, MPI_MIN, comm);
  if (first_bad == 0x7fffffff) return;
  int len = rank == first_bad ? static_cast<int>(local_error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first_bad, comm);
  std::vector<char> buf(local_error.begin(), local_error.end());
  buf.resize(static_cast<size_t>(len));
  MPI_Bcast(buf.data(), len, MPI_CHAR, first_bad, comm);
  throw Error::all(std::string(buf.begin(), buf.end()));
}

}  // namespace trident
