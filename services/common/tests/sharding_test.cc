#include <gtest/gtest.h>

#include <vector>

#include "musku/sharding.h"

TEST(Sharding, JumpIsInRangeBalancedAndMinimallyDisruptive) {
  const int n = 8;
  std::vector<int> counts(n, 0);
  int moved = 0;
  for (uint64_t k = 0; k < 80000; ++k) {
    int s = musku::JumpShard(musku::StableHash(std::to_string(k)), n);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, n);
    ++counts[s];
    int s9 = musku::JumpShard(musku::StableHash(std::to_string(k)), n + 1);
    if (s9 != s) {
      ++moved;
      EXPECT_EQ(s9, n);  // keys only move to the new shard
    }
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 600);
  EXPECT_NEAR(moved, 80000 / 9, 800);
}

TEST(Sharding, StableHashIsStable) {
  EXPECT_EQ(musku::StableHash(""), 1469598103934665603ULL);
  EXPECT_NE(musku::StableHash("a"), musku::StableHash("b"));
  EXPECT_EQ(musku::DocShard(10, 3), 1);
}
