// Collective agreement on errors (docs/DESIGN.md "Errors and exit codes"): the ranks of a group
// each bring their own local error text, and either all go on or all throw the same Error::all.
// Used wherever a check can fail on some ranks only (a file one rank reads, a path one rank
// probes), so that no rank is left waiting in a later collective.
#pragma once
#include <mpi.h>

#include <exception>
#include <string>

#include "common/error.hpp"

namespace trident {

// Every rank of `comm` calls this with its own local error text (empty when fine). If any rank
// failed, every rank throws Error::all with the message of the lowest failing rank.
void agree_or_throw(MPI_Comm comm, const std::string& local_error);

// Runs f(); if it throws on some ranks only, turns that into a collective Error::all.
template <class F>
void collectively(MPI_Comm comm, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_or_throw(comm, err);
}

}  // namespace trident
