#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lsh.h"
#include "shard.h"
#include "vectors.h"

namespace mh = musku::hdsearch;

namespace {

// Seeded clustered data: `clusters` Gaussian centres, points scattered around them.
std::vector<float> Clustered(std::size_t n, std::uint32_t dim, std::uint32_t clusters, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> centres(static_cast<std::size_t>(clusters) * dim);
  for (float& c : centres) c = 4.0f * g(rng);
  std::vector<float> out(n * dim);
  std::uniform_int_distribution<std::uint32_t> pick(0, clusters - 1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t c = pick(rng);
    for (std::uint32_t d = 0; d < dim; ++d) out[i * dim + d] = centres[c * dim + d] + g(rng);
  }
  return out;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/hdsearch_" + name + "_" + std::to_string(::getpid());
}

double Recall(const mh::LshIndex& index, const std::vector<float>& data, const std::vector<float>& queries,
              std::uint32_t dim, std::size_t k, double* mean_candidates) {
  mh::LshScratch scratch;
  const std::size_t n = data.size() / dim, nq = queries.size() / dim;
  double hits = 0, cands = 0;
  for (std::size_t qi = 0; qi < nq; ++qi) {
    const float* q = queries.data() + qi * dim;
    std::vector<std::uint32_t> cand;
    index.Query(q, &scratch, &cand);
    cands += static_cast<double>(cand.size());
    // exact distances over the candidates only, as the leaves do
    std::vector<std::pair<float, std::uint32_t>> d;
    for (std::uint32_t id : cand) d.emplace_back(mh::SquaredL2(data.data() + id * dim, q, dim), id);
    std::sort(d.begin(), d.end());
    std::set<std::uint32_t> got;
    for (std::size_t j = 0; j < std::min(k, d.size()); ++j) got.insert(d[j].second);
    for (std::uint32_t id : mh::BruteForceKnn(data.data(), n, dim, q, k)) hits += got.count(id);
  }
  *mean_candidates = cands / static_cast<double>(nq);
  return hits / static_cast<double>(nq * k);
}

}  // namespace

TEST(Vectors, KernelsMatchNaive) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t dim : {1u, 7u, 16u, 17u, 100u, 784u, 2048u}) {
    std::vector<float> a(dim), b(dim);
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    double l2 = 0, dot = 0;
    for (std::size_t i = 0; i < dim; ++i) {
      l2 += (a[i] - b[i]) * (a[i] - b[i]);
      dot += a[i] * b[i];
    }
    EXPECT_NEAR(mh::SquaredL2(a.data(), b.data(), dim), l2, 1e-4 * (1 + l2));
    EXPECT_NEAR(mh::Dot(a.data(), b.data(), dim), dot, 1e-4 * (1 + std::fabs(dot)));
  }
}

TEST(Vectors, FileRoundTripAndShardRange) {
  const std::string path = TempPath("rt");
  std::vector<float> data = Clustered(10, 5, 2, 1);
  mh::WriteVecFile(path, data, 5);
  const mh::VecHeader h = mh::ReadVecHeader(path);
  EXPECT_EQ(h.rows, 10u);
  EXPECT_EQ(h.dim, 5u);
  const auto rows = mh::ReadVecRows(path, h, 3, 7);
  ASSERT_EQ(rows.size(), 20u);
  EXPECT_EQ(rows[0], data[15]);
  EXPECT_EQ(rows[19], data[34]);
  EXPECT_THROW(mh::ReadVecRows(path, h, 7, 11), mh::DataError);
  std::remove(path.c_str());
}

TEST(Vectors, CorruptFilesAreRejectedWithAReason) {
  const std::string path = TempPath("bad");
  std::vector<float> data(40, 1.0f);
  mh::WriteVecFile(path, data, 4);
  {  // truncated: drop the last 3 bytes
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  }
  try {
    mh::ReadVecHeader(path);
    FAIL() << "truncated file accepted";
  } catch (const mh::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::binary) << "NOTAVECTORFILE-------------------------";
  EXPECT_THROW(mh::ReadVecHeader(path), mh::DataError);
  std::ofstream(path, std::ios::binary) << "MKU";
  EXPECT_THROW(mh::ReadVecHeader(path), mh::DataError);
  data[13] = NAN;
  mh::WriteVecFile(path, data, 4);
  const auto h = mh::ReadVecHeader(path);
  EXPECT_THROW(mh::ReadVecRows(path, h, 0, 10), mh::DataError);
  EXPECT_THROW(mh::ReadVecHeader(path + ".missing"), mh::DataError);
  std::remove(path.c_str());
}

TEST(Shard, TopKExactAndRejectsForeignIds) {
  const std::uint32_t dim = 8;
  auto data = Clustered(100, dim, 3, 5);
  // shard holds global ids [50, 100)
  mh::Shard shard(std::vector<float>(data.begin() + 50 * dim, data.end()), dim, 50);
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 50; i < 100; ++i) ids.push_back(i);
  const float* q = data.data() + 60 * dim;  // query = point 60 itself
  std::vector<std::uint32_t> out;
  std::vector<float> dist;
  ASSERT_EQ(shard.TopK(q, dim, ids.data(), ids.size(), 5, &out, &dist), "");
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0], 60u);
  EXPECT_FLOAT_EQ(dist[0], 0.0f);
  for (std::size_t i = 1; i < dist.size(); ++i) EXPECT_LE(dist[i - 1], dist[i]);
  std::uint32_t foreign = 10;
  EXPECT_NE(shard.TopK(q, dim, &foreign, 1, 5, &out, &dist), "");
  EXPECT_NE(shard.TopK(q, dim - 1, ids.data(), ids.size(), 5, &out, &dist), "");
  EXPECT_NE(shard.TopK(q, dim, ids.data(), ids.size(), 0, &out, &dist), "");
  // fewer candidates than k: all of them
  ASSERT_EQ(shard.TopK(q, dim, ids.data(), 3, 10, &out, &dist), "");
  EXPECT_EQ(out.size(), 3u);
}

TEST(Lsh, RejectsBadParameters) {
  mh::LshParams p;
  p.bucket_width = 0;
  EXPECT_THROW(mh::LshIndex(4, p), std::invalid_argument);
  p.bucket_width = 1;
  p.tables = 0;
  EXPECT_THROW(mh::LshIndex(4, p), std::invalid_argument);
  p.tables = 2;
  EXPECT_THROW(mh::LshIndex(0, p), std::invalid_argument);
}

TEST(Lsh, RecallAgainstBruteForceAndMultiProbeHelps) {
  const std::uint32_t dim = 128, k = 10;
  auto data = Clustered(20200, dim, 50, 11);
  const std::vector<float> queries(data.begin() + 20000 * dim, data.end());  // 200 held-out points
  data.resize(20000 * dim);
  mh::LshParams p;
  p.bucket_width = mh::EstimateBucketWidth(data.data(), 20000, dim, 1, 4.0f);
  p.probes = 0;
  mh::LshIndex single(dim, p);
  single.Add(data.data(), 20000, 0);
  single.Finalize();
  p.probes = 16;
  mh::LshIndex multi(dim, p);
  multi.Add(data.data(), 20000, 0);
  multi.Finalize();
  double c0 = 0, c1 = 0;
  const double r0 = Recall(single, data, queries, dim, k, &c0);
  const double r1 = Recall(multi, data, queries, dim, k, &c1);
  std::printf("recall@10: single-probe %.3f (%.0f cand), multi-probe %.3f (%.0f cand) of 20000\n", r0, c0,
              r1, c1);
  EXPECT_GE(r1, 0.93);
  EXPECT_GE(r1, r0);
  EXPECT_GT(c1, c0);
  EXPECT_LT(c1, 20000 * 0.25) << "LSH degenerated into a linear scan";
}

TEST(Lsh, ExactDuplicateIsAlwaysFound) {
  const std::uint32_t dim = 32;
  const auto data = Clustered(2000, dim, 10, 7);
  mh::LshParams p;
  p.bucket_width = 4.0f;
  p.probes = 0;
  mh::LshIndex index(dim, p);
  index.Add(data.data(), 2000, 0);
  index.Finalize();
  mh::LshScratch s;
  for (std::uint32_t i = 0; i < 2000; i += 97) {
    std::vector<std::uint32_t> cand;
    index.Query(data.data() + i * dim, &s, &cand);
    EXPECT_NE(std::find(cand.begin(), cand.end(), i), cand.end());
    std::set<std::uint32_t> uniq(cand.begin(), cand.end());
    EXPECT_EQ(uniq.size(), cand.size()) << "candidates not deduplicated";
  }
}

// Candidates come out strictly ascending (the mid-tier groups them by shard without sorting),
// more probes only add candidates (the probe sequence is deterministic per query), and ids far
// apart (a second chunk at 1e6) are found and the per-thread bitmap is left clean for the next
// query.
TEST(Lsh, CandidatesAscendDistinctAndGrowWithProbes) {
  const std::uint32_t dim = 16;
  const auto data = Clustered(3000, dim, 12, 21);
  auto build = [&](std::uint32_t probes) {
    mh::LshParams p;
    p.tables = 6;
    p.hashes = 8;
    p.bucket_width = 3.0f;
    p.probes = probes;
    auto index = std::make_unique<mh::LshIndex>(dim, p);
    index->Add(data.data(), 2000, 0);
    index->Add(data.data() + 2000 * dim, 1000, 1000000);  // ids 1000000 .. 1000999
    index->Finalize();
    return index;
  };
  const auto p0 = build(0), p8 = build(8), p32 = build(32);
  mh::LshScratch s0, s8, s32;
  std::size_t far = 0, total0 = 0, total32 = 0;
  for (std::uint32_t i = 0; i < 3000; i += 37) {
    const float* q = data.data() + i * dim;
    std::vector<std::uint32_t> c0, c8, c32;
    p0->Query(q, &s0, &c0);
    p8->Query(q, &s8, &c8);
    p32->Query(q, &s32, &c32);
    for (const auto* c : {&c0, &c8, &c32}) {
      ASSERT_TRUE(std::adjacent_find(c->begin(), c->end(), std::greater_equal<std::uint32_t>()) == c->end())
          << "candidates not strictly ascending for query " << i;
    }
    EXPECT_TRUE(std::includes(c8.begin(), c8.end(), c0.begin(), c0.end())) << "query " << i;
    EXPECT_TRUE(std::includes(c32.begin(), c32.end(), c8.begin(), c8.end())) << "query " << i;
    const std::uint32_t id = i < 2000 ? i : 1000000 + (i - 2000);
    EXPECT_TRUE(std::binary_search(c0.begin(), c0.end(), id)) << "a point must find itself, query " << i;
    far += static_cast<std::size_t>(std::count_if(c32.begin(), c32.end(), [](std::uint32_t x) { return x >= 1000000; }));
    total0 += c0.size();
    total32 += c32.size();
    // The same scratch answers the same query identically (its bitmap was cleared).
    std::vector<std::uint32_t> again;
    p32->Query(q, &s32, &again);
    EXPECT_EQ(again, c32);
  }
  EXPECT_GT(far, 0u);
  EXPECT_GT(total32, total0);
}
