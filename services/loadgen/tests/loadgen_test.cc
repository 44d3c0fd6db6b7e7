#include <gtest/gtest.h>

#include <cmath>

#include "loadgen.h"

TEST(Arrivals, ExponentialGapsHaveTheRightMeanAndSpread) {
  loadgen::Arrivals a(7);
  const double qps = 2000;
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double g = static_cast<double>(a.NextGapNs(qps)) / 1e9;
    sum += g;
    sum2 += g * g;
  }
  const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, 1 / qps, 0.01 / qps);
  EXPECT_NEAR(sd / mean, 1.0, 0.02);  // exponential: CV = 1 (periodic traffic would give 0)
}

TEST(Schedule, Parses) {
  std::vector<loadgen::Phase> p;
  EXPECT_EQ(loadgen::ParseSchedule("100:2,5000:1", &p), "");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].qps, 5000);
  EXPECT_NE(loadgen::ParseSchedule("100", &p), "");
  EXPECT_NE(loadgen::ParseSchedule("0:1", &p), "");
  EXPECT_NE(loadgen::ParseSchedule("x:1", &p), "");
  EXPECT_NE(loadgen::ParseSchedule("", &p), "");
}

TEST(Requests, LengthPrefixedFileErrors) {
  loadgen::Workload w;
  EXPECT_NE(loadgen::LoadLengthPrefixed("/nonexistent", "/a.B/C", &w), "");
}
