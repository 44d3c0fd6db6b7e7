// The auto-tuner's policy with no server: the load estimator's windows, the decision table
// (loading, Pick, Decide's evidence rule, Settle), the persistence and overload guard.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

#include "auto_policy.h"
#include "table_files.h"

namespace {

using musku_test::kRows;
using musku_test::Table;
using musku_test::WriteFile;

TEST(Table, LoadsAndRejectsCorruptStaleForeign) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  musku::PoolSizes max{2, 2, 2};
  musku::detail::DecisionTable t;
  auto ok = WriteFile(Table("fan", cpus, kRows));
  EXPECT_EQ(musku::detail::LoadDecisionTable(ok, "fan", max, &t), "");
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.Pick(10), 0u);
  EXPECT_EQ(t.Pick(5000), 1u);
  auto corrupt = WriteFile("{\"format\": \"musku-threading-table/1\", \"rows\": [");
  EXPECT_NE(musku::detail::LoadDecisionTable(corrupt, "fan", max, &t).find("corrupt"), std::string::npos);
  auto stale = WriteFile(Table("fan", cpus + 1, kRows));
  EXPECT_NE(musku::detail::LoadDecisionTable(stale, "fan", max, &t).find("stale"), std::string::npos);
  auto foreign = WriteFile(Table("other", cpus, kRows));
  EXPECT_NE(musku::detail::LoadDecisionTable(foreign, "fan", max, &t), "");
  auto big = WriteFile(Table("fan", cpus, R"({"max_qps": 5, "model": "sync-inline-block", "pollers": 9, "workers": 0, "responders": 0})"));
  EXPECT_NE(musku::detail::LoadDecisionTable(big, "fan", max, &t), "");
  EXPECT_NE(musku::detail::LoadDecisionTable("/nonexistent/t.json", "fan", max, &t), "");
  // trained over one leaf transport, stale for the other; no field = trained over unary calls
  std::string batch_text = Table("fan", cpus, kRows);
  batch_text.insert(1, R"("leaf_transport": "batch", )");
  auto batch = WriteFile(batch_text);
  EXPECT_EQ(musku::detail::LoadDecisionTable(batch, "fan", max, &t, musku::LeafTransport::kBatch), "");
  EXPECT_NE(musku::detail::LoadDecisionTable(batch, "fan", max, &t, musku::LeafTransport::kUnary)
                .find("trained with leaf transport 'batch'"),
            std::string::npos);
  EXPECT_NE(musku::detail::LoadDecisionTable(ok, "fan", max, &t, musku::LeafTransport::kBatch)
                .find("stale"),
            std::string::npos);
  for (auto& p : {ok, corrupt, stale, foreign, big, batch}) std::remove(p.c_str());
}

// Poisson arrivals at `qps` from `t` for `secs` into `e`; every 5 ms (the default
// --auto-interval-ms) `decide(now, current row, ns since the row changed)` gives the next row.
// Returns the number of row changes and the first time (ns after start) the row was `watch`.
template <class Decide>
std::pair<int, int64_t> Arrivals(musku::detail::LoadEstimator& e, std::mt19937_64& rng, int64_t& t,
                              double qps, double secs, size_t& row, int64_t& since,
                              Decide decide, size_t watch = SIZE_MAX) {
  std::exponential_distribution<double> gap(qps * 1e-9);
  const int64_t start = t, end = t + static_cast<int64_t>(secs * 1e9);
  int64_t next = t + static_cast<int64_t>(gap(rng)), tick = t + 5'000'000, seen = -1;
  int changes = 0;
  while (tick <= end) {
    if (next <= tick) {
      e.Record(next);
      next += std::max<int64_t>(1, static_cast<int64_t>(gap(rng)));
      continue;
    }
    const size_t r = decide(tick, row, tick - since);
    if (r != row) ++changes, since = tick;
    row = r;
    if (row == watch && seen < 0) seen = tick - start;
    tick += 5'000'000;
  }
  t = end;
  return {changes, seen};
}

TEST(Overload, HoldsThePeakRowUntilTheBacklogStaysLow) {
  using musku::detail::OverloadGuard;
  constexpr int64_t ms = 1'000'000, high = 32;
  OverloadGuard g;
  int64_t t = 0;
  EXPECT_FALSE(g.Update(31, high, t));  // below the mark: no overload
  EXPECT_TRUE(g.Update(32, high, t += 5 * ms));
  // A starved poller: the backlog drains and refills every few ms. Held throughout, however
  // often it dips to zero, as long as no dip lasts kCalmNs.
  for (int i = 0; i < 200; ++i) {
    EXPECT_TRUE(g.Update(i % 3 == 0 ? 40 : (i % 3 == 1 ? 12 : 0), high, t += 5 * ms)) << i;
  }
  // Calm: held for kCalmNs from the first low reading, released after it; the calm's start is
  // kept (only arrivals from then on are evidence for the next decision).
  const int64_t calm = t += 5 * ms;
  EXPECT_TRUE(g.Update(8, high, calm));
  while (t + 5 * ms - calm < OverloadGuard::kCalmNs) EXPECT_TRUE(g.Update(3, high, t += 5 * ms));
  EXPECT_FALSE(g.Update(0, high, t += 5 * ms));
  EXPECT_FALSE(g.overloaded);
  EXPECT_EQ(g.calm_since, calm);
  // A backlog above a quarter of the mark during the calm starts it again.
  EXPECT_TRUE(g.Update(high, high, t += 5 * ms));
  EXPECT_TRUE(g.Update(0, high, t += 5 * ms));
  EXPECT_TRUE(g.Update(9, high, t += 200 * ms));
  EXPECT_TRUE(g.Update(0, high, t += 5 * ms));
  EXPECT_TRUE(g.Update(0, high, t += 200 * ms));  // 200 ms into the new calm
  EXPECT_FALSE(g.Update(0, high, t += 60 * ms));
}

TEST(Overload, ABacklogMustPersistBeforeItIsAnOverload) {
  using musku::detail::OverloadGuard;
  constexpr int64_t ms = 1'000'000, high = 32, persist = 20 * ms;
  OverloadGuard g;
  int64_t t = 0;
  // A host stall: the backlog jumps past the mark, drains within 15 ms and stays low.
  for (int64_t b : {40, 64, 50, 33}) EXPECT_FALSE(g.Update(b, high, t += 5 * ms, persist)) << b;
  EXPECT_FALSE(g.Update(20, high, t += 5 * ms, persist));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(g.Update(3, high, t += 5 * ms, persist)) << i;
  EXPECT_FALSE(g.overloaded);
  // 20 ms low ended that run: the next reading at the mark starts a new one, which the stall's
  // readings do not shorten.
  EXPECT_FALSE(g.Update(high, high, t += 5 * ms, persist));
  // An overload on a starved poller: the backlog dips, to zero too, and comes back. The dips
  // are shorter than `persist` and do not end the run; 20 ms after it began it is an overload.
  EXPECT_FALSE(g.Update(0, high, t += 5 * ms, persist));
  EXPECT_FALSE(g.Update(40, high, t += 5 * ms, persist));
  EXPECT_FALSE(g.Update(12, high, t += 5 * ms, persist));
  EXPECT_TRUE(g.Update(48, high, t += 5 * ms, persist));
  EXPECT_TRUE(g.overloaded);
  EXPECT_TRUE(g.Update(0, high, t += 5 * ms, persist));  // held from here as without persistence
  // Without persistence the first reading at the mark is the overload (the test above).
  OverloadGuard at_once;
  EXPECT_TRUE(at_once.Update(high, high, 0, 0));
}

TEST(Decide, HoldsARowNearABoundAndFollowsRealChanges) {
  // Bounds as a trained Set Algebra table has them: geometric midpoints of the ramp's loads.
  musku::detail::DecisionTable table;
  for (double b : {45.0, 1414.0, 3190.0, 1e12}) table.rows.push_back({b, {}});
  std::mt19937_64 rng(7);
  auto evidence = [&](musku::detail::LoadEstimator& e) {
    return [&table, &e](int64_t now, size_t row, int64_t age) {
      return table.Decide(e.Counts(now), row, age);
    };
  };
  auto naive = [&](musku::detail::LoadEstimator& e) {  // the plain estimate, no evidence rule
    return [&table, &e](int64_t now, size_t, int64_t) { return table.Pick(e.Estimate(now)); };
  };
  {  // 3393 QPS, 6 % above a bound: the plain estimate flaps, the evidence rule holds a row.
    musku::detail::LoadEstimator e1, e2;
    std::mt19937_64 rng2 = rng;
    int64_t t1 = 1'000'000'000, t2 = t1, c1 = 0, c2 = 0;
    size_t r1 = 2, r2 = 2;
    EXPECT_GT(Arrivals(e1, rng, t1, 3393, 10, r1, c1, naive(e1)).first, 50)
        << "the plain estimate should flap at 6 % from a bound";
    EXPECT_LE(Arrivals(e2, rng2, t2, 3393, 10, r2, c2, evidence(e2)).first, 1);
    EXPECT_GE(r2, 2u);
  }
  {  // Mid-row (1000 QPS, row 1) and low load (20 QPS, row 0): never moves.
    musku::detail::LoadEstimator e, e0;
    int64_t t = 1'000'000'000, t0 = t, since = 0, since0 = 0;
    size_t r = 1, r0 = 0;
    EXPECT_EQ(Arrivals(e, rng, t, 1000, 10, r, since, evidence(e)).first, 0);
    EXPECT_EQ(Arrivals(e0, rng, t0, 20, 30, r0, since0, evidence(e0)).first, 0);
  }
  {  // Flash crowd 100 -> 3393 -> 100 QPS: up within ~50 ms; back down within 100 ms, in at most
     // two steps (10 ms of arrivals cannot tell 100 from 1000 QPS at 4 sigma; the crowd's full
     // second may still lift it a row just as it ends), then still.
    musku::detail::LoadEstimator e;
    int64_t t = 1'000'000'000, since = 0;
    size_t r = 1;
    Arrivals(e, rng, t, 100, 2, r, since, evidence(e));
    EXPECT_EQ(r, 1u);
    auto up = Arrivals(e, rng, t, 3393, 1, r, since, evidence(e), 2);
    EXPECT_GE(up.second, 0);
    EXPECT_LE(up.second, 50'000'000);
    EXPECT_GE(r, 2u);
    auto down = Arrivals(e, rng, t, 100, 3, r, since, evidence(e), 1);
    EXPECT_GE(down.second, 0);
    EXPECT_LE(down.second, 100'000'000);
    EXPECT_LE(down.first, 3);
    EXPECT_EQ(r, 1u);
  }
  {  // A step across a bound (1000 -> 2000 QPS, bound 1414) moves once, within a second.
    musku::detail::LoadEstimator e;
    int64_t t = 1'000'000'000, since = 0;
    size_t r = 1;
    Arrivals(e, rng, t, 1000, 2, r, since, evidence(e));
    auto step = Arrivals(e, rng, t, 2000, 5, r, since, evidence(e), 2);
    EXPECT_EQ(step.first, 1);
    EXPECT_LE(step.second, 1'000'000'000);
    EXPECT_EQ(r, 2u);
  }
}

namespace {
musku::Threading Cfg(const char* model, int p, int w, int r) {
  musku::Threading t;
  t.model = *musku::ThreadingModel::Parse(model);
  t.pools = {p, w, r};
  return t;
}
// Windows of a steady `qps` going back `age_ns` (the longer ones unknown).
std::array<musku::detail::LoadEstimator::Window, musku::detail::LoadEstimator::kWindows> Steady(
    double qps, int64_t age_ns) {
  std::array<musku::detail::LoadEstimator::Window, musku::detail::LoadEstimator::kWindows> w{};
  for (int i = 0; i < musku::detail::LoadEstimator::kWindows; ++i) {
    const int64_t ns = musku::detail::LoadEstimator::kWindowNs[i];
    w[static_cast<size_t>(i)] = {ns, static_cast<uint64_t>(qps * static_cast<double>(ns) / 1e9),
                                 ns <= age_ns};
  }
  return w;
}
}  // namespace

TEST(Decide, KeepsTheConfigurationWhenARowTheEvidenceReachesHasIt) {
  // Run F's table (session 7): the peak-load row has the 2449-4899 row's configuration.
  musku::detail::DecisionTable t;
  const auto adp = Cfg("async-dispatch-poll", 1, 2, 1);
  t.rows = {{224, Cfg("async-dispatch-block", 1, 2, 1)}, {707, Cfg("sync-dispatch-block", 1, 2, 0)},
            {1414, adp}, {2449, Cfg("async-inline-poll", 1, 0, 1)}, {4899, adp},
            {6833, Cfg("async-inline-block", 1, 0, 1)}, {1e12, adp}};
  constexpr int64_t ms = 1'000'000;
  double ev = -1;
  // 4000 QPS seen from the peak-load row for 60 ms: the 50 ms window's interval (3000-5300)
  // lies below 6833. Its near end alone would pick the 4899-6833 row (a switch now, another
  // when a longer window narrows it); the 2449-4899 row is reached too and is the running
  // configuration, so only the row index moves.
  EXPECT_EQ(t.Decide(Steady(4000, 60 * ms), 6, 60 * ms, &ev), 4u);
  EXPECT_GT(ev, 4899);
  // No row the evidence reaches has the configuration: the near end's row, as before (1000 QPS
  // from async-inline-block: the 10 ms window's interval ends at 3300).
  EXPECT_EQ(t.Decide(Steady(1000, 60 * ms), 5, 60 * ms, &ev), 4u);
  EXPECT_GT(ev, 2449);
  // A crowd seen from the lowest row: up to the near end's row (async-inline-poll).
  EXPECT_EQ(t.Decide(Steady(3000, 60 * ms), 0, 60 * ms), 3u);
}

TEST(Decide, SettlesAfterAnOverloadInOneMove) {
  musku::detail::DecisionTable t;
  t.rows = {{224, Cfg("async-dispatch-block", 1, 2, 1)}, {707, Cfg("sync-dispatch-block", 1, 2, 0)},
            {1414, Cfg("async-dispatch-poll", 1, 2, 1)}, {2449, Cfg("async-inline-poll", 1, 0, 1)},
            {4899, Cfg("sync-inline-poll", 1, 0, 0)}, {6833, Cfg("async-inline-block", 1, 0, 1)},
            {1e12, Cfg("sync-dispatch-poll", 1, 2, 0)}};
  constexpr int64_t ms = 1'000'000;
  // The overload held the peak-load row; a 260 ms calm at 4000 QPS follows. Decide steps down
  // on its shortest conclusive window (the 4899-6833 row first), Settle goes straight to the
  // row of the 250 ms window's upper end.
  const auto w = Steady(4000, 260 * ms);
  EXPECT_EQ(t.Decide(w, 6, 260 * ms), 5u);
  double ev = -1;
  EXPECT_EQ(t.Settle(w, 6, 260 * ms, &ev), 4u);
  EXPECT_GT(ev, 4000);
  EXPECT_LT(ev, 4899);
  // After a flash crowd, 100 QPS: the lowest row at once.
  EXPECT_EQ(t.Settle(Steady(100, 260 * ms), 6, 260 * ms), 0u);
  // No window within the calm yet: stays.
  EXPECT_EQ(t.Settle(Steady(100, 5 * ms), 6, 5 * ms), 6u);
}

TEST(Estimator, ReactsToAFlashCrowdWithinMilliseconds) {
  musku::detail::LoadEstimator e;
  int64_t t = 1'000'000'000;
  for (int i = 0; i < 200; ++i) e.Record(t += 10'000'000);  // 100 QPS for 2 s
  const double before = e.Estimate(t);
  EXPECT_NEAR(before, 100, 15);
  const int64_t crowd_start = t;
  for (int i = 0; i < 50; ++i) e.Record(t += 200'000);  // 5000 QPS for 10 ms
  EXPECT_GT(e.Estimate(t), 2000);
  EXPECT_LE(t - crowd_start, 10'000'000);
  EXPECT_LT(e.Estimate(t + 5'000'000'000), 1);  // and forgets after the window
}

}  // namespace
