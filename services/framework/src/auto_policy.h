// The auto-tuner's policy (--threading auto): a load estimator over sliding windows, the
// decision table trained by `musku tune train` (which configuration serves which load, and when
// the evidence justifies a move), and the overload guard. Pure logic over timestamps, counts
// and the backlog: the engine (control.cc) feeds it; tests drive it with no server.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "musku/framework.h"

namespace musku::detail {

// Arrival counts over several sliding windows (10 ms .. 1 s). Estimate() is the rate in the
// shortest window that holds enough arrivals to be meaningful (a flash crowd shows within ~32
// arrivals); Counts() gives every window, for decisions that weigh the evidence of each.
class LoadEstimator {
 public:
  static constexpr int kWindows = 4;
  static constexpr int64_t kWindowNs[kWindows] = {10'000'000, 50'000'000, 250'000'000,
                                                  1'000'000'000};
  struct Window {
    int64_t ns = 0;      // length actually covered (shorter if the ring ran out)
    uint64_t count = 0;  // arrivals within it
    bool known = false;  // false: the window reaches back before the first arrival recorded
  };
  void Record(int64_t now_ns);
  double Estimate(int64_t now_ns) const;
  std::array<Window, kWindows> Counts(int64_t now_ns) const;

 private:
  static constexpr size_t kRing = 8192;
  mutable std::mutex mu_;
  std::vector<int64_t> ring_ = std::vector<int64_t>(kRing, 0);
  uint64_t n_ = 0;
  int64_t first_ns_ = 0;  // the first arrival recorded
};

struct DecisionRow {
  double max_qps = 0;  // this row applies up to (and including) this load
  Threading threading;
};

struct DecisionTable {
  std::string path;
  std::vector<DecisionRow> rows;
  // Row whose load range holds `qps` (no hysteresis: the initial choice).
  size_t Pick(double qps) const;
  // Auto: stays on `current` unless, in some window, the whole kZ-sigma interval of the arrival
  // rate (Poisson score interval) lies above the row's upper bound or below its lower bound;
  // then moves to the row of the interval's near end, as far as the evidence reaches. Windows
  // are tried shortest first, so a flash crowd moves it within ~10 ms and a small drift across
  // a bound within ~1 s. Only windows within the row's age (`row_age_ns`, time since the row
  // was chosen) count: arrivals from before the last change are no evidence against it. A load
  // near a bound keeps whichever row it is on instead of flapping on the estimate's noise.
  // An upward move also needs kMinArrivals in the window: at tens of QPS a 10 ms window's
  // Poisson tail (4 arrivals at 20 QPS) is fatter than its interval admits.
  // A move keeps the current configuration when a row the interval reaches has it (adjacent
  // rows often share a model): only the row index changes, nothing is switched.
  static constexpr double kZ = 4.0;
  static constexpr double kMinArrivals = 8;
  // `evidence`, when given and the row changes: the interval's near end that moved it (QPS).
  size_t Decide(const std::array<LoadEstimator::Window, LoadEstimator::kWindows>& windows,
                size_t current, int64_t row_age_ns, double* evidence = nullptr) const;
  // Leaving an overload (auto held the peak-load row): the row of the upper end of the longest
  // window within `calm_ns` (the calm's arrivals only), in one move. Decide's shortest-first
  // walk would step down through the rows, a switch each, as its windows fill. `current` if no
  // window fits in the calm yet; the current configuration is kept where it can be, as Decide.
  size_t Settle(const std::array<LoadEstimator::Window, LoadEstimator::kWindows>& windows,
                size_t current, int64_t calm_ns, double* evidence = nullptr) const;

 private:
  // Rate interval [lo, hi] of a window's arrivals (Poisson score interval, kZ sigma).
  static std::pair<double, double> Interval(const LoadEstimator::Window& w);
  // Row i's lower load bound (exclusive).
  double Lo(size_t i) const { return i > 0 ? rows[i - 1].max_qps : 0.0; }
  // `target`, unless a row whose load range meets [lo, hi] has `current`'s configuration:
  // then that row (the one nearest `target`).
  size_t KeepConfiguration(size_t target, size_t current, double lo, double hi) const;
};

// A condition that must read true at every check for `persist_ns` before it counts. After a
// host stall the queued arrivals are admitted in a burst at the configuration's capacity, and
// until they drain they look like a rise in load.
struct Persistence {
  int64_t since = -1;  // first check of the current run of true readings (-1: none)
  bool Check(bool condition, int64_t now, int64_t persist_ns) {
    if (!condition) {
      since = -1;
      return false;
    }
    if (since < 0) since = now;
    return now - since >= persist_ns;
  }
};

// Auto's overload state. Arrivals are stamped when a poller admits them, so an overloaded
// mid-tier measures its own capacity, and on a shared core a starved poller admits nothing for
// milliseconds: the estimate then shows a falling load while the offered load is unchanged
// and queued in the transport, unseen by the backlog too. So the backlog (admitted, unfinished
// RPCs) puts auto on the peak-load row when it reads at or above `high` `persist_ns` after it
// first did, without having stayed at or below high / 4 for `persist_ns` in between: a host
// stall's burst drains within that and then stays low; an overload's backlog keeps coming back,
// its dips (a starved poller) do not count. Auto stays on the peak-load row until the backlog
// has stayed at or below high / 4 for kCalmNs; only arrivals from that calm count as evidence
// afterwards (calm_since), and they settle the row in one move (DecisionTable::Settle).
// Leaving at the first low backlog flapped: 20 switches in one 1 s flash crowd at 85 % of
// saturation, each "load-down" on a 10 ms window of a starved poller.
struct OverloadGuard {
  static constexpr int64_t kCalmNs = 250'000'000;
  bool overloaded = false;
  int64_t calm_since = -1;  // start of the current calm while overloaded (-1: not calm)
  int64_t run_since = -1;  // not overloaded: the first reading at the mark of this run
  Persistence quiet;       // the backlog at or below high / 4 (a reading at the mark resets it)
  // True while auto must hold the peak-load row.
  bool Update(int64_t backlog, int64_t high, int64_t now, int64_t persist_ns = 0) {
    if (!overloaded) {
      if (quiet.Check(backlog <= high / 4, now, persist_ns))
        run_since = -1;  // the run drained
      else if (backlog >= high && run_since < 0)
        run_since = now;
      if (backlog < high || now - run_since < persist_ns) return false;
      run_since = -1;
    }
    if (backlog >= high) {
      overloaded = true;
      calm_since = -1;
      return true;
    }
    if (backlog > high / 4) {
      calm_since = -1;
      return true;
    }
    if (calm_since < 0) calm_since = now;
    if (now - calm_since < kCalmNs) return true;
    overloaded = false;
    return false;
  }
};

// "" on success; else a clear reason (unreadable, corrupt JSON, wrong format, other service,
// other CPU count = stale, impossible pool sizes).
std::string LoadDecisionTable(const std::string& path, const std::string& service,
                              const PoolSizes& max, DecisionTable* out,
                              LeafTransport transport = LeafTransport::kUnary);

}  // namespace musku::detail
