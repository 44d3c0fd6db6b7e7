#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "ratings.h"

namespace mr = musku::recommend;

namespace {

// Seeded low-rank ratings on 1..5 (user/item non-negative factors + noise), split train/test.
void Synthetic(std::uint32_t users, std::uint32_t items, double density, std::uint64_t seed, mr::RatingSet* train,
               mr::RatingSet* test) {
  std::mt19937_64 rng(seed);
  std::gamma_distribution<float> g(2.0f, 0.5f);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::uniform_real_distribution<double> u01(0, 1);
  const int rank = 6;
  std::vector<float> U(users * rank), V(items * rank);
  for (auto& x : U) x = g(rng);
  for (auto& x : V) x = g(rng);
  train->users = test->users = users;
  train->items = test->items = items;
  for (std::uint32_t u = 0; u < users; ++u) {
    for (std::uint32_t i = 0; i < items; ++i) {
      if (u01(rng) >= density) continue;
      float s = 0;
      for (int r = 0; r < rank; ++r) s += U[u * rank + r] * V[i * rank + r];
      const float rating = std::clamp(std::round(1.0f + s * 0.6f + noise(rng)), 1.0f, 5.0f);
      (u01(rng) < 0.1 ? test : train)->ratings.push_back({u, i, rating});
    }
  }
}

std::string Temp(const std::string& name) {
  return ::testing::TempDir() + "/recommend_" + name + "_" + std::to_string(::getpid());
}

double Rmse(const mr::CfModel& m, const mr::RatingSet& test, double* baseline, float global_mean) {
  double se = 0, base = 0;
  for (const auto& r : test.ratings) {
    float p = 0;
    std::uint32_t n = 0;
    EXPECT_EQ(m.Predict(r.user, r.item, &p, &n), mr::CfModel::Result::kOk);
    se += (p - r.rating) * (p - r.rating);
    base += (global_mean - r.rating) * (global_mean - r.rating);
  }
  *baseline = std::sqrt(base / test.ratings.size());
  return std::sqrt(se / test.ratings.size());
}

float Mean(const mr::RatingSet& s) {
  double t = 0;
  for (const auto& r : s.ratings) t += r.rating;
  return static_cast<float>(t / s.ratings.size());
}

}  // namespace

TEST(Ratings, RoundTripAndShardsPartition) {
  mr::RatingSet train, test;
  Synthetic(50, 40, 0.3, 3, &train, &test);
  const std::string path = Temp("rt");
  mr::WriteRatings(path, train);
  const auto all = mr::ReadRatings(path);
  ASSERT_EQ(all.ratings.size(), train.ratings.size());
  EXPECT_EQ(all.users, 50u);
  EXPECT_EQ(all.items, 40u);
  EXPECT_EQ(all.ratings[7].item, train.ratings[7].item);
  std::size_t total = 0;
  for (std::uint32_t s = 0; s < 3; ++s) {
    const auto part = mr::ReadRatings(path, s, 3);
    total += part.ratings.size();
    EXPECT_GT(part.ratings.size(), train.ratings.size() / 5);  // roughly balanced
    for (const auto& r : part.ratings) EXPECT_EQ(mr::ShardOf(r.user, r.item, 3), s);
  }
  EXPECT_EQ(total, train.ratings.size());
  std::remove(path.c_str());
}

TEST(Ratings, CorruptFilesAreRejected) {
  mr::RatingSet train, test;
  Synthetic(20, 20, 0.5, 4, &train, &test);
  const std::string path = Temp("bad");
  mr::WriteRatings(path, train);
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 5);
  }
  try {
    mr::ReadRatings(path);
    FAIL() << "truncated file accepted";
  } catch (const mr::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos);
  }
  train.ratings[3].user = 999;  // out of range id
  mr::WriteRatings(path, train);
  EXPECT_THROW(mr::ReadRatings(path), mr::DataError);
  train.ratings[3].user = 1;
  train.ratings[4].rating = NAN;
  mr::WriteRatings(path, train);
  EXPECT_THROW(mr::ReadRatings(path), mr::DataError);
  std::ofstream(path, std::ios::binary) << "garbage";
  EXPECT_THROW(mr::ReadRatings(path), mr::DataError);
  EXPECT_THROW(mr::ReadRatings(path + ".missing"), mr::DataError);
  std::remove(path.c_str());
}

TEST(CfModel, BeatsGlobalMeanOnHeldOutRatings) {
  mr::RatingSet train, test;
  Synthetic(400, 300, 0.08, 5, &train, &test);
  mr::CfOptions o;
  o.rank = 8;
  o.iterations = 60;
  const mr::CfModel m(train, o);
  double baseline = 0;
  const double rmse = Rmse(m, test, &baseline, Mean(train));
  std::printf("held-out RMSE %.4f vs global-mean %.4f (NMF train RMSE %.4f)\n", rmse, baseline, m.TrainRmse());
  EXPECT_LT(rmse, baseline * 0.9);
}

TEST(CfModel, NmfFitsBetterWithMoreIterations) {
  mr::RatingSet train, test;
  Synthetic(200, 150, 0.1, 6, &train, &test);
  mr::CfOptions o;
  o.rank = 8;
  o.iterations = 2;
  const double few = mr::CfModel(train, o).TrainRmse();
  o.iterations = 60;
  const double many = mr::CfModel(train, o).TrainRmse();
  EXPECT_LT(many, few);
  EXPECT_LT(many, 1.0);
}

TEST(CfModel, UnknownIdsAndBadOptions) {
  mr::RatingSet train, test;
  Synthetic(30, 30, 0.3, 7, &train, &test);
  mr::CfOptions o;
  o.iterations = 5;
  const mr::CfModel m(train, o);
  float p = 0;
  std::uint32_t n = 0;
  EXPECT_EQ(m.Predict(30, 0, &p, &n), mr::CfModel::Result::kUnknownUser);
  EXPECT_EQ(m.Predict(0, 30, &p, &n), mr::CfModel::Result::kUnknownItem);
  EXPECT_EQ(m.Predict(29, 29, &p, &n), mr::CfModel::Result::kOk);
  EXPECT_GE(p, 1.0f);
  EXPECT_LE(p, 5.0f);
  o.rank = 0;
  EXPECT_THROW(mr::CfModel(train, o), std::invalid_argument);
  mr::RatingSet empty;
  empty.users = empty.items = 3;
  EXPECT_THROW(mr::CfModel(empty, mr::CfOptions{}), std::invalid_argument);
}
