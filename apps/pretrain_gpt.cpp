// pretrain_gpt: GPT pretraining (and evaluation mode) from an input deck.
//   mpiexec -n N pretrain_gpt --deck inputs/gpt_small.ini [--section.key value ...]
#include "train/app_driver.hpp"
#include "train/gpt_training.hpp"

int main(int argc, char** argv) { return trident::run_deck_app(argc, argv, trident::run_gpt); }
