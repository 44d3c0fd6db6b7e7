#include "placement.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace mr = musku::router;

TEST(Placement, DistinctConsecutiveReplicas) {
  for (int i = 0; i < 1000; ++i) {
    const std::string key = "user" + std::to_string(i);
    auto rs = mr::ReplicaSet(key, 5, 3);
    ASSERT_EQ(rs.size(), 3u);
    std::set<std::uint32_t> uniq(rs.begin(), rs.end());
    EXPECT_EQ(uniq.size(), 3u);
    EXPECT_EQ(rs[1], (rs[0] + 1) % 5);
    EXPECT_EQ(rs[2], (rs[0] + 2) % 5);
    EXPECT_EQ(rs, mr::ReplicaSet(key, 5, 3));  // deterministic
  }
}

TEST(Placement, ReplicasCappedByLeavesAndEmptyCases) {
  EXPECT_EQ(mr::ReplicaSet("k", 2, 3).size(), 2u);
  EXPECT_TRUE(mr::ReplicaSet("k", 0, 3).empty());
  EXPECT_TRUE(mr::ReplicaSet("k", 4, 0).empty());
}

TEST(Placement, PrimariesSpreadEvenly) {
  constexpr int kLeaves = 8, kKeys = 80000;
  std::vector<int> count(kLeaves, 0);
  for (int i = 0; i < kKeys; ++i) ++count[mr::ReplicaSet("key:" + std::to_string(i), kLeaves, 1)[0]];
  for (int c : count) {
    EXPECT_GT(c, kKeys / kLeaves * 0.9);
    EXPECT_LT(c, kKeys / kLeaves * 1.1);
  }
}

TEST(Placement, KeyValidation) {
  EXPECT_EQ(mr::ValidateKey("abc:123"), "");
  EXPECT_NE(mr::ValidateKey(""), "");
  EXPECT_NE(mr::ValidateKey("has space"), "");
  EXPECT_NE(mr::ValidateKey(std::string("nl\n", 3)), "");
  EXPECT_NE(mr::ValidateKey(std::string(251, 'a')), "");
  EXPECT_EQ(mr::ValidateKey(std::string(250, 'a')), "");
}
