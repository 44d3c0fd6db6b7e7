#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "musku/histogram.h"

TEST(Histogram, BucketsAreContiguousAndTight) {
  for (int i = 1; i < musku::Histogram::NumBuckets(); ++i)
    ASSERT_EQ(musku::Histogram::LowerBound(i), musku::Histogram::UpperBound(i - 1) + 1) << i;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    int64_t v = static_cast<int64_t>(rng() % musku::Histogram::kMaxValue);
    int idx = musku::Histogram::IndexOf(v);
    ASSERT_LE(musku::Histogram::LowerBound(idx), v);
    ASSERT_GE(musku::Histogram::UpperBound(idx), v);
    const double width = static_cast<double>(musku::Histogram::UpperBound(idx) -
                                             musku::Histogram::LowerBound(idx));
    ASSERT_LE(width, 0.016 * static_cast<double>(std::max<int64_t>(v, 128)));
  }
}

TEST(Histogram, PercentilesMatchSortedReferenceWithinPrecision) {
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> d(1.0 / 250000.0);
  std::vector<int64_t> vals;
  musku::Histogram h;
  for (int i = 0; i < 200000; ++i) {
    auto v = static_cast<int64_t>(d(rng));
    vals.push_back(v);
    h.Record(v);
  }
  std::sort(vals.begin(), vals.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const double ref = static_cast<double>(vals[static_cast<size_t>(q * vals.size()) - 1]);
    const double got = static_cast<double>(h.Percentile(q));
    EXPECT_NEAR(got, ref, ref * 0.016 + 1) << q;
  }
  EXPECT_EQ(h.Count(), vals.size());
  EXPECT_EQ(h.Max(), vals.back());
  EXPECT_EQ(h.Percentile(1.0), vals.back());
}

TEST(Histogram, ConcurrentRecordAndMerge) {
  musku::Histogram h;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&h, t] {
      for (int i = 0; i < 50000; ++i) h.Record(1000 * (t + 1));
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(h.Count(), 200000u);
  musku::Histogram g;
  g.Record(5);
  g.Merge(h);
  EXPECT_EQ(g.Count(), 200001u);
  EXPECT_EQ(g.Percentile(0.0), 5);
  EXPECT_EQ(g.Max(), 4000);
  h.Reset();
  EXPECT_EQ(h.Count(), 0u);
  EXPECT_EQ(h.Percentile(0.99), 0);
}

TEST(Histogram, ClampsOutOfRange) {
  musku::Histogram h;
  h.Record(-5);
  h.Record(musku::Histogram::kMaxValue * 4);
  EXPECT_EQ(h.Count(), 2u);
  EXPECT_EQ(h.Percentile(0.0), 0);
  EXPECT_EQ(h.Max(), musku::Histogram::kMaxValue);
}
