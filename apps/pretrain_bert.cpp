// pretrain_bert: BERT pretraining (masked LM + sentence order) from an input deck.
//   mpiexec -n N pretrain_bert --deck inputs/bert_tiny_ci.ini [--section.key value ...]
#include "runtime/app_driver.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  return trident::run_deck_app(argc, argv, [](const trident::Deck& deck) {
    return trident::run_training(deck, trident::ModelFamily::Bert);
  });
}
