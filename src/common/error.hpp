// Errors. Two kinds, after LAMMPS' error->all / error->one:
//  - Error::all  : a condition every rank detects the same way (bad deck, bad shard, bad
//                  checkpoint shape). The driver prints it once and every rank exits cleanly.
//  - Error::one  : a condition only this rank saw. The driver prints it with the rank and
//                  aborts the job so that no other rank hangs in a collective.
// Library code never calls exit(); it throws, and apps/ decide how to leave.
#pragma once
#include <mpi.h>
#include <sstream>
#include <stdexcept>
#include <string>

namespace trident {

class Error : public std::runtime_error {
 public:
  enum class Scope { all_ranks, one_rank };
  Error(Scope scope, const std::string& what) : std::runtime_error(what), scope_(scope) {}
  Scope scope() const { return scope_; }
  static Error all(const std::string& what) { return Error(Scope::all_ranks, what); }
  static Error one(const std::string& what) { return Error(Scope::one_rank, what); }

 private:
  Scope scope_;
};

// The collective agreement on errors met by some ranks only is comm/agreement.hpp.

}  // namespace trident

#define TRIDENT_REQUIRE(cond, msg)                    \
  do {                                                \
    if (!(cond)) {                                    \
      std::ostringstream trident_os_;                 \
      trident_os_ << msg;                             \
      throw ::trident::Error::all(trident_os_.str()); \
    }                                                 \
  } while (0)

#define TRIDENT_CHECK_MPI(call)                                                                                      \
  do {                                                                                                               \
    int trident_rc_ = (call);                                                                                        \
    if (trident_rc_ != MPI_SUCCESS) {                                                                                \
      std::ostringstream trident_os_;                                                                                \
      trident_os_ << "MPI call " #call " failed with code " << trident_rc_ << " at " << __FILE__ << ":" << __LINE__; \
      throw ::trident::Error::one(trident_os_.str());                                                                \
    }                                                                                                                \
  } while (0)
