// The common body of every app's main(): MPI and Kokkos set-up, and the two kinds of error
// exit (docs/DESIGN.md "Errors and faults"): an Error::all is printed once by rank 0 and every rank returns 1; anything
// else is printed with its rank and the job is aborted so no rank hangs.
#pragma once
#include <functional>

namespace trident {

// Exit code of a failed run (a run stopped by a signal exits with train/stop_signal.hpp's codes).
inline constexpr int kExitFailure = 1;

int run_app(int argc, char** argv, const std::function<int(int, char**)>& body);

struct Deck;
// run_app for a pretraining app: parses the deck (printing --help on rank 0) and runs `train`.
int run_deck_app(int argc, char** argv, int (*train)(const Deck&));

}  // namespace trident
