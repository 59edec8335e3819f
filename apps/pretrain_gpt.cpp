// pretrain_gpt: GPT pretraining (and evaluation mode) from an input deck.
//   mpiexec -n N pretrain_gpt --deck inputs/gpt_small.ini [--section.key value ...]
#include <mpi.h>

#include <iostream>

#include "io/deck.hpp"
#include "train/app_driver.hpp"
#include "train/gpt_training.hpp"

int main(int argc, char** argv) {
  return trident::run_app(argc, argv, [](int ac, char** av) {
    trident::Deck deck;
    std::string help;
    if (!trident::parse_deck(ac, av, deck, &help)) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) std::cout << help;
      return 0;
    }
    return trident::run_gpt(deck);
  });
}
