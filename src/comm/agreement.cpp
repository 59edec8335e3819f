// Collective error agreement (agree_or_throw, comm/agreement.hpp): a minimum all-reduce finds the
// lowest rank with a local error, that rank broadcasts its message, and every rank throws it as
// Error::all. The collectives mark themselves for the watchdog (common/progress.hpp).
#include "comm/agreement.hpp"

#include <cstdint>
#include <limits>

#include "comm/communicator.hpp"

namespace trident {

void agree_or_throw(MPI_Comm comm, const std::string& local_error) {
  Communicator group = Communicator::borrow(comm);
  int same = MPI_UNEQUAL;
  TRIDENT_CHECK_MPI(MPI_Comm_compare(comm, MPI_COMM_WORLD, &same));
  group.set_name(same == MPI_IDENT ? "world" : "agreement");  // in watchdog reports
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  const std::int64_t first_bad = group.allreduce_min(local_error.empty() ? kNone : std::int64_t{group.rank()});
  if (first_bad == kNone) return;
  throw Error::all(group.broadcast_text(local_error, static_cast<int>(first_bad)));
}

}  // namespace trident
