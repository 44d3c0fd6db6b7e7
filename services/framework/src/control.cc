// Threading control: the configuration in force, switching it (Admin.SetThreading), and auto
// (the decision table and the overload guard of auto_policy.h applied to this engine's load).
#include <algorithm>

#include "engine.h"
#include "engine_threads.h"

namespace musku::detail {

Threading Engine::Current() const {
  Threading t;
  t.model.leaf = static_cast<LeafCallMode>(leaf_mode_.load());
  t.model.dispatch = static_cast<DispatchMode>(dispatch_mode_.load());
  t.model.wait = static_cast<WaitMode>(wait_mode_.load());
  t.pools = {n_pollers_.load(), n_workers_.load(), n_responders_.load()};
  return t;
}

std::string Engine::ApplyLocked(const Threading& t, const char* reason, double qps) {
  if (std::string why = ValidateThreading(t, opts_.max_pools); !why.empty()) return why;
  const Threading cur = Current();
  if (cur.model == t.model && cur.pools == t.pools) return "";
  const int64_t now = MonotonicNs();
  switch_log_.push_back({now, cur.ToString(), t.ToString(), reason,
                         qps >= 0 ? qps : estimator_.Estimate(now),
                         inflight_.load(std::memory_order_relaxed)});
  if (switch_log_.size() > kSwitchLog) switch_log_.pop_front();
  // Pools first (a new model never sees a pool it needs at size 0), then the model.
  n_workers_.store(t.pools.workers, std::memory_order_release);
  n_responders_.store(t.pools.responders, std::memory_order_release);
  if (!pollers_.empty() && !shutting_down_.load()) {
    for (int k = cur.pools.pollers; k < t.pools.pollers; ++k)
      for (size_t f = 0; f < factories_.size(); ++f) {
        const int missing = factories_[f].per_cq - pollers_[static_cast<size_t>(k)]->armed[f].load();
        if (missing > 0) ArmOn(k, f, missing);
      }
  }
  n_pollers_.store(t.pools.pollers, std::memory_order_release);
  leaf_mode_.store(static_cast<int>(t.model.leaf), std::memory_order_release);
  dispatch_mode_.store(static_cast<int>(t.model.dispatch), std::memory_order_release);
  wait_mode_.store(static_cast<int>(t.model.wait), std::memory_order_release);
  switches_.fetch_add(1);
  return "";
}

std::string Engine::SetThreading(const Threading& t) {
  std::lock_guard<std::mutex> lk(config_mu_);
  std::string why = ApplyLocked(t, "set");
  if (!why.empty()) {
    last_error_ = why;
    return why;
  }
  auto_ = false;
  return "";
}

std::string Engine::SetAuto(const std::string& path_in) {
  std::lock_guard<std::mutex> lk(config_mu_);
  const std::string path = path_in.empty() ? table_.path : path_in;
  if (path.empty()) {
    last_error_ = "auto needs a threading table (table_path)";
    return last_error_;
  }
  DecisionTable t;
  if (std::string why = LoadDecisionTable(path, opts_.service, opts_.max_pools, &t, opts_.leaf_transport);
      !why.empty()) {
    last_error_ = why;
    return why;
  }
  table_ = std::move(t);
  overload_ = OverloadGuard{};
  rise_ = Persistence{};
  table_row_since_ns_ = MonotonicNs();
  table_row_ = table_.Pick(estimator_.Estimate(table_row_since_ns_));
  ApplyLocked(table_.rows[table_row_].threading, "auto");
  last_auto_ns_ = 0;
  auto_ = true;
  return "";
}

void Engine::MaybeAuto(int64_t now) {
  int64_t last = last_auto_ns_.load(std::memory_order_relaxed);
  if (now - last < static_cast<int64_t>(opts_.auto_interval_ms) * 1000000) return;
  if (!last_auto_ns_.compare_exchange_strong(last, now)) return;
  std::unique_lock<std::mutex> lk(config_mu_, std::try_to_lock);
  if (!lk.owns_lock() || !auto_.load() || table_.rows.empty()) return;
  // Arrivals are timestamped when a poller takes them, so an overloaded model shows its own
  // capacity, not the offered load, and the estimate could hold it on a row it cannot serve.
  // A backlog of admitted, unfinished RPCs is the overload signal: go to the peak-load row and
  // hold it until the backlog has drained and stayed low (OverloadGuard).
  const int64_t backlog = inflight_.load(std::memory_order_relaxed);
  const int64_t high = std::max<int64_t>(8, static_cast<int64_t>(opts_.contexts_per_cq) *
                                                n_pollers_.load(std::memory_order_relaxed) / 2);
  size_t row;
  const char* reason = "backlog";
  double evidence = -1;
  const bool was_overloaded = overload_.overloaded;
  const int64_t persist_ns = static_cast<int64_t>(opts_.auto_persist_ms) * 1000000;
  if (overload_.Update(backlog, high, now, persist_ns)) {
    row = table_.rows.size() - 1;
  } else if (was_overloaded) {
    // Out of an overload: only arrivals from its calm tell the load, and they settle the row.
    table_row_since_ns_ = std::max(table_row_since_ns_, overload_.calm_since);
    row = table_.Settle(estimator_.Counts(now), table_row_, now - table_row_since_ns_, &evidence);
    reason = "calm";
  } else {
    row = table_.Decide(estimator_.Counts(now), table_row_, now - table_row_since_ns_, &evidence);
    const bool up = row > table_row_;
    reason = up ? "load-up" : "load-down";
    // A rise moves auto only once it has persisted (a stall's burst drains within it); the
    // move then goes where the latest evidence reaches.
    const bool rise_held = rise_.Check(up, now, persist_ns);
    if (up && !rise_held) return;
  }
  if (row == table_row_) return;
  rise_ = Persistence{};
  table_row_ = row;
  table_row_since_ns_ = now;
  if (std::string why = ApplyLocked(table_.rows[row].threading, reason, evidence); !why.empty())
    last_error_ = why;
}

void Engine::NoteArrivals(int n, int64_t now) {
  for (int i = 0; i < n; ++i) estimator_.Record(now);
  if (n > 0 && auto_.load(std::memory_order_relaxed)) MaybeAuto(now);
}

std::vector<Engine::SwitchRecord> Engine::RecentSwitches() const {
  std::lock_guard<std::mutex> lk(config_mu_);
  return {switch_log_.begin(), switch_log_.end()};
}

std::string Engine::table_path() const {
  std::lock_guard<std::mutex> lk(config_mu_);
  return table_.path;
}

std::string Engine::last_error() const {
  std::lock_guard<std::mutex> lk(config_mu_);
  return last_error_;
}

}  // namespace musku::detail
