// Input deck (io/deck): defaults and derived values, command-line overrides, the resolved text
// round-tripping through to_ini(), errors that name the key (missing, unknown or invalid), and
// '%' in keys or values, which must never hang Boost.Program_options.
#include <gtest/gtest.h>

#include "common/error.hpp"
#include "io/deck.hpp"

using namespace trident;

namespace {
const char* kDeck = R"(
[model]
num_layers = 2
hidden_size = 64
num_heads = 4
seq_length = 32
[train]
micro_batch_size = 2
global_batch_size = 8
iters = 10
[data]
train_shards = x.h5
)";

std::string error_of(const std::string& ini, const std::vector<std::string>& over = {}) {
  try {
    parse_deck_text(ini, over);
  } catch (const Error& e) {
    EXPECT_EQ(e.scope(), Error::Scope::all_ranks);
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Deck, DefaultsAndDerivedValues) {
  Deck d = parse_deck_text(kDeck);
  EXPECT_EQ(d.model.ffn_hidden_size, 256);
  EXPECT_EQ(d.model.max_position_embeddings, 32);
  EXPECT_EQ(d.optim.decay_iters, 10);
  EXPECT_EQ(d.precision.dtype, "fp32");
}

TEST(Deck, CommandLineOverridesWin) {
  Deck d = parse_deck_text(kDeck, {"--train.iters", "99", "--optim.lr=0.5"});
  EXPECT_EQ(d.train.iters, 99);
  EXPECT_DOUBLE_EQ(d.optim.lr, 0.5);
}

TEST(Deck, ResolvedTextRoundTrips) {
  Deck d = parse_deck_text(kDeck, {"--optim.lr", "0.00025"});
  Deck e = parse_deck_text(d.to_ini());
  EXPECT_EQ(e.to_ini(), d.to_ini());
  EXPECT_DOUBLE_EQ(e.optim.lr, 0.00025);
}

TEST(Deck, MissingRequiredKeysAreNamed) {
  std::string no_iters = kDeck;
  no_iters.erase(no_iters.find("iters = 10"), 10);
  EXPECT_NE(error_of(no_iters).find("train.iters is required"), std::string::npos) << error_of(no_iters);
  const std::string two = error_of(
      "[model]\nnum_layers = 2\nhidden_size = 64\nnum_heads = 4\n[train]\nglobal_batch_size = 8\n"
      "iters = 1\n[data]\ntrain_shards = x.h5\n");
  EXPECT_NE(two.find("model.seq_length is required"), std::string::npos) << two;
  // given on the command line instead of the deck: fine
  EXPECT_EQ(error_of(no_iters, {"--train.iters", "3"}), "");
}

TEST(Deck, ErrorsNameTheKey) {
  EXPECT_NE(error_of(std::string(kDeck) + "[model]\nnum_layerz = 3\n").find("model.num_layerz"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--train.iters", "ten"}).find("train.iters"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--bogus.key", "1"}).find("bogus.key"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--model.num_heads", "5"}).find("model.num_heads"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--optim.decay_style", "exp"}).find("optim.decay_style"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--optim.distributed", "maybe"}).find("optim.distributed"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--train.global_batch_size", "7"}).find("train.global_batch_size"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--model.max_position_embeddings", "16"}).find("model.max_position_embeddings"),
            std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--precision.dtype", "fp8"}).find("precision.dtype"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--precision.loss_scale", "128"}).find("precision.loss_scale"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--precision.recompute", "some"}).find("precision.recompute"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--precision.recompute_method", "random"}).find("precision.recompute_method"),
            std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--precision.recompute", "full", "--precision.recompute_num_layers", "0"})
                .find("precision.recompute_num_layers"),
            std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--optim.min_lr", "1"}).find("optim.min_lr"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--model.num_layers", "0"}).find("model.num_layers"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--model.attention_backend", "flash"}).find("model.attention_backend"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--model.attention_backend", "cudnn"}).find("model.flash_attention"), std::string::npos);
  // the [bert] and [t5] keys are checked with the deck, before any data is read
  for (const char* key : {"--bert.mask_prob", "--t5.mask_prob"})
    for (const char* bad : {"0", "1", "-0.1"})
      EXPECT_NE(error_of(kDeck, {key, bad}).find(key + 2), std::string::npos) << key << " " << bad;
  EXPECT_NE(error_of(kDeck, {"--bert.short_seq_prob", "1.5"}).find("bert.short_seq_prob"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--bert.max_ngrams", "0"}).find("bert.max_ngrams"), std::string::npos);
  EXPECT_NE(error_of(kDeck, {"--t5.geometric_p", "0"}).find("t5.geometric_p"), std::string::npos);
  // the longer of the two sequence lengths is the one named (T5's decoder may be the longer)
  const std::string dec = error_of(kDeck,
                                   {"--model.max_position_embeddings", "40", "--model.decoder_seq_length", "48"});
  EXPECT_NE(dec.find("model.decoder_seq_length (48)"), std::string::npos) << dec;
}

// Boost.Program_options loops forever on a message whose key or value holds one of its
// placeholders (%canonical_option%, %value%): found by tests/fuzz/fuzz_deck. Such decks now fail
// (or parse) at once, and '%' in a string value is kept.
TEST(Deck, PercentSignsNeverHangTheParser) {
  const std::string base =
      "[model]\nnum_layers=1\nhidden_size=8\nnum_heads=1\nseq_length=4\n[train]\n"
      "global_batch_size=1\niters=1\n[data]\ntrain_shards=x.h5\n";
  EXPECT_THROW(parse_deck_text(base + "[bert]\nbi%canonical_option%nary_head = true\n"), Error);
  EXPECT_THROW(parse_deck_text(base + "[optim]\nlr = %value%\n"), Error);
  EXPECT_THROW(parse_deck_text(base, {"--train.iters", "%canonical_option%"}), Error);
  const Deck d = parse_deck_text(base + "[perf]\npeak_name = 100% of %value% dense\n");
  EXPECT_EQ(d.perf.peak_name, "100% of %value% dense");
}

TEST(Deck, DistributedOptimizerIsOnByDefaultAtDpAboveOne) {
  Deck d;
  EXPECT_EQ(d.optim.distributed, "auto");
  EXPECT_FALSE(distributed_optimizer("auto", 1));
  EXPECT_TRUE(distributed_optimizer("auto", 2));
  EXPECT_TRUE(distributed_optimizer("auto", 64));
  for (const char* on : {"true", "1", "yes", "on"}) EXPECT_TRUE(distributed_optimizer(on, 1)) << on;
  for (const char* off : {"false", "0", "no", "off"}) EXPECT_FALSE(distributed_optimizer(off, 8)) << off;
  EXPECT_THROW(distributed_optimizer("sometimes", 2), Error);
}
