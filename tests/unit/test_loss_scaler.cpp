// Dynamic loss scaling against Megatron's DynamicGradScaler rules, step by step: back-off after
// `hysteresis` consecutive overflows, growth and a restored budget after a clean window, the
// min_scale floor and the skipped-step count; the constant scaler only counts skipped steps.
#include <gtest/gtest.h>

#include "optim/loss_scaler.hpp"

namespace trident {
namespace {

TEST(LossScaler, BacksOffAfterHysteresisOverflowsAndGrowsAfterACleanWindow) {
  LossScalerConfig c;
  c.initial = 1024;
  c.min_scale = 64;
  c.window = 3;
  c.hysteresis = 2;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 1024);
  // first overflow: skipped, scale kept (hysteresis budget 2 -> 1)
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024);
  // second consecutive overflow: halved
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  // the budget is not restored by a clean step alone: the next overflow halves again
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256);
  // a window of 3 clean steps doubles the scale and restores the budget
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);  // budget 2 again: first overflow keeps the scale
  // never below the minimum
  for (int i = 0; i < 20; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 64);
  EXPECT_EQ(s.skipped(), 3 + 1 + 20);
}

TEST(LossScaler, ConstantScaleNeverChangesButCountsSkippedSteps) {
  LossScalerConfig c;
  c.initial = 128;
  c.dynamic = false;
  LossScaler s(c);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.skipped(), 1);
}

}  // namespace
}  // namespace trident
