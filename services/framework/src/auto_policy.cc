// The auto-tuner's policy: the load estimator, the decision table (with its loader), the
// overload guard's pieces. Pure logic over timestamps and counts: no threads, no gRPC server.
#include "auto_policy.h"

#include "table_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

namespace musku::detail {

// ------------------------------------------------------------------------------------------
// Load estimator

void LoadEstimator::Record(int64_t now) {
  std::lock_guard<std::mutex> lk(mu_);
  if (n_ == 0) first_ns_ = now;
  ring_[n_ % kRing] = now;
  ++n_;
}

std::array<LoadEstimator::Window, LoadEstimator::kWindows> LoadEstimator::Counts(
    int64_t now) const {
  std::array<Window, kWindows> out{};
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t avail = std::min<uint64_t>(n_, kRing);
  // Arrival k (0 = newest) was at age(k); ages grow with k, so each window's count is a binary
  // search (pollers stamp arrivals just before taking the lock, so the order is exact to within
  // that race, which moves a count by one at most).
  auto stamp = [&](uint64_t k) { return ring_[(n_ - 1 - k) % kRing]; };
  uint64_t count = 0;  // arrivals within the current window
  for (int i = 0; i < kWindows; ++i) {
    const int64_t since = now - kWindowNs[i];
    uint64_t lo = count, hi = avail;  // the first arrival at or before `since` is in [lo, hi]
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (stamp(mid) > since)
        lo = mid + 1;
      else
        hi = mid;
    }
    count = lo;
    out[i].count = count;
    out[i].ns = kWindowNs[i];
    out[i].known = n_ > 0 && now - kWindowNs[i] >= first_ns_;
    // The ring is full and its oldest arrival is inside the window: the count covers only the
    // span since that arrival.
    if (count == kRing) {
      out[i].ns = std::max<int64_t>(1, now - ring_[(n_ - count) % kRing]);
      out[i].known = true;
    }
  }
  return out;
}

double LoadEstimator::Estimate(int64_t now) const {
  static constexpr uint64_t kEnough = 32;
  const auto w = Counts(now);
  for (int i = 0; i < kWindows; ++i) {
    if (w[i].count >= kEnough || i == kWindows - 1)  // a full ring is >= kEnough too
      return static_cast<double>(w[i].count) * 1e9 / static_cast<double>(w[i].ns);
  }
  return 0;
}

// ------------------------------------------------------------------------------------------
// Decision table

size_t DecisionTable::Pick(double qps) const {
  size_t i = 0;
  while (i + 1 < rows.size() && qps > rows[i].max_qps) ++i;
  return i;
}

std::pair<double, double> DecisionTable::Interval(const LoadEstimator::Window& w) {
  constexpr double z2 = kZ * kZ;
  const double c = static_cast<double>(w.count), secs = static_cast<double>(w.ns) * 1e-9;
  // Score interval of a Poisson rate: (c + z^2/2 -+ z sqrt(c + z^2/4)) / window.
  const double half = kZ * std::sqrt(c + z2 / 4);
  return {(c + z2 / 2 - half) / secs, (c + z2 / 2 + half) / secs};
}

size_t DecisionTable::KeepConfiguration(size_t target, size_t current, double lo,
                                        double hi) const {
  size_t best = target;
  size_t best_gap = SIZE_MAX;
  for (size_t i = 0; i < rows.size(); ++i) {
    const bool meets = Lo(i) < hi && (rows[i].max_qps >= lo || i + 1 == rows.size());
    if (!meets || rows[i].threading != rows[current].threading) continue;
    const size_t gap = i > target ? i - target : target - i;
    if (gap < best_gap) best = i, best_gap = gap;
  }
  return best;
}

size_t DecisionTable::Decide(
    const std::array<LoadEstimator::Window, LoadEstimator::kWindows>& windows, size_t current,
    int64_t row_age_ns, double* evidence) const {
  if (rows.empty()) return 0;
  if (current >= rows.size()) current = rows.size() - 1;
  const double lo = Lo(current);
  const bool top = current + 1 == rows.size();
  const double hi = rows[current].max_qps;
  for (const auto& w : windows) {
    // No history that far back (just started), or older than the current row: no evidence.
    if (!w.known || w.ns > row_age_ns) continue;
    const auto [rate_lo, rate_hi] = Interval(w);
    // Move only as far as the evidence reaches: to the row of the interval's near end.
    const bool up = !top && static_cast<double>(w.count) >= kMinArrivals && rate_lo > hi;
    if (up || rate_hi < lo) {
      const double near = up ? rate_lo : rate_hi;
      if (evidence) *evidence = near;
      return KeepConfiguration(Pick(near), current, rate_lo, rate_hi);
    }
  }
  return current;
}

size_t DecisionTable::Settle(
    const std::array<LoadEstimator::Window, LoadEstimator::kWindows>& windows, size_t current,
    int64_t calm_ns, double* evidence) const {
  if (rows.empty()) return 0;
  if (current >= rows.size()) current = rows.size() - 1;
  for (int i = LoadEstimator::kWindows - 1; i >= 0; --i) {
    const auto& w = windows[static_cast<size_t>(i)];
    if (!w.known || w.ns > calm_ns) continue;
    const auto [rate_lo, rate_hi] = Interval(w);
    if (evidence) *evidence = rate_hi;
    return KeepConfiguration(Pick(rate_hi), current, rate_lo, rate_hi);
  }
  return current;
}

std::string LoadDecisionTable(const std::string& path, const std::string& service,
                              const PoolSizes& max, DecisionTable* out, LeafTransport transport) {
  std::ifstream in(path);
  if (!in) return "cannot read threading table " + path;
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return "threading table " + path + " is corrupt (not JSON): " + e.what();
  }
  DecisionTable t;
  t.path = path;
  try {
    if (!j.is_object() || !j.contains("format") || j["format"] != "musku-threading-table/1")
      return "threading table " + path + " has no format \"musku-threading-table/1\"";
    // The rules musku's pydantic model states (types, known models, pool sizes, increasing
    // rows), from the schema file it exports: both sides refuse the same tables.
    if (std::string why = ValidateSchema(j, ThreadingTableSchema()); !why.empty())
      return "threading table " + path + ": " + why;
    const std::string svc = j.at("service").get<std::string>();
    if (svc != service)
      return "threading table " + path + " was trained for service '" + svc + "', not '" +
             service + "'";
    const int cpus = j.at("cpus").get<int>();
    const int here = static_cast<int>(std::thread::hardware_concurrency());
    if (cpus != here)
      return "threading table " + path + " is stale: trained on " + std::to_string(cpus) +
             " CPUs, this host has " + std::to_string(here) + "; retrain with `musku tune train`";
    // A table measured over one leaf transport says nothing about the other (tables from
    // before the field existed were all trained over unary calls).
    const std::string trained = j.value("leaf_transport", std::string("unary"));
    const std::string mine = transport == LeafTransport::kBatch ? "batch" : "unary";
    if (trained != mine)
      return "threading table " + path + " is stale: trained with leaf transport '" + trained +
             "', this mid-tier uses '" + mine + "'; retrain with `musku tune train`";
    double prev = -1;
    for (const auto& r : j.at("rows")) {
      DecisionRow row;
      row.max_qps = r.at("max_qps").get<double>();
      auto m = ThreadingModel::Parse(r.at("model").get<std::string>());
      if (!m) return "threading table " + path + ": unknown model " + r.at("model").dump();
      row.threading.model = *m;
      row.threading.pools = {r.at("pollers").get<int>(), r.at("workers").get<int>(),
                             r.at("responders").get<int>()};
      if (!(row.max_qps > prev))
        return "threading table " + path + ": rows must have increasing max_qps";
      prev = row.max_qps;
      if (std::string why = ValidateThreading(row.threading, max); !why.empty())
        return "threading table " + path + ": row " + row.threading.ToString() + ": " + why;
      t.rows.push_back(row);
    }
  } catch (const nlohmann::json::exception& e) {
    return "threading table " + path + " is corrupt: " + e.what();
  }
  if (t.rows.empty()) return "threading table " + path + " has no rows";
  *out = std::move(t);
  return "";
}

}  // namespace musku::detail
