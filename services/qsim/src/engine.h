// μqSim-style discrete-event queueing-network simulator of microservice graphs (docs/qsim.md).
//
// The engine reads a *normalised* model (JSON written by musku/qsim/model.py, which validates
// the user's TOML); every timing rule is data in that model. One time-ordered event heap, pooled
// job objects, per-stream xoshiro256** generators derived from the run seed, log-linear
// histograms. Memory is bounded by the live state: a run whose live requests or jobs exceed the
// model's limits stops and reports saturation.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

namespace musku::qsim {

// Thrown for a malformed normalised model (the CLI maps it to exit status 3).
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------ random numbers

class Rng {  // xoshiro256**, seeded through splitmix64
 public:
  explicit Rng(uint64_t seed = 1);
  uint64_t Next();
  double Uniform();  // [0, 1)
  double Exp(double mean);
  double Normal();

 private:
  uint64_t s_[4];
};

uint64_t DeriveSeed(uint64_t run_seed, uint64_t stream);

// ------------------------------------------------------------------ histogram

// Log-linear histogram of non-negative integer values (ns): exact below 2,048 ns, then 1,024
// sub-buckets per power of two (<= 0.098 % relative bucket width; a percentile is its bucket's
// midpoint, so within 0.05 % of the recorded value). Octaves are allocated on first use, so an
// idle histogram costs a few dozen bytes and a busy one the few octaves its values span. No
// atomics: the simulator is single-threaded and records 10^8 values per run.
class Hist {
 public:
  static constexpr int kSubBits = 11;  // 2^11 exact values, then 2^10 buckets per octave
  static constexpr int kSegments = 35;  // segments of 2^10 buckets: 2 exact, then octaves to 2^44 ns
  Hist() = default;
  Hist(const Hist& o) { *this = o; }
  Hist& operator=(const Hist& o);
  Hist(Hist&&) = default;
  Hist& operator=(Hist&&) = default;
  void Record(int64_t v) {  // inline: it runs for every job and request
    if (v < 0) v = 0;
    const int i = Index(v);
    const size_t s = static_cast<size_t>(i >> (kSubBits - 1));
    uint64_t* seg = seg_[s] ? seg_[s].get() : Segment(s);
    ++seg[i & ((1 << (kSubBits - 1)) - 1)];
    ++count_;
    sum_ += static_cast<double>(v);
    if (v > max_) max_ = v;
  }
  static constexpr int64_t kMaxValue = (int64_t{1} << 44) - 1;
  static constexpr int Index(int64_t v) {  // the bucket of a value (clamped to [0, kMaxValue])
    if (v < 0) v = 0;
    if (v > kMaxValue) v = kMaxValue;
    if (v < (1 << kSubBits)) return static_cast<int>(v);
    const int shift = (63 - __builtin_clzll(static_cast<uint64_t>(v))) - (kSubBits - 1);
    return shift * (1 << (kSubBits - 1)) + static_cast<int>(v >> shift);
  }
  void Merge(const Hist& o);
  uint64_t Count() const { return count_; }
  double Mean() const { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
  int64_t Max() const { return max_; }
  int64_t Percentile(double q) const;
  nlohmann::json Summary() const;  // {count, mean_us, p50_us, p90_us, p99_us, p999_us, max_us}
  nlohmann::json Buckets() const;  // non-empty buckets as [upper bound in us, count]

 private:
  uint64_t* Segment(size_t s);  // allocated on first use
  std::unique_ptr<uint64_t[]> seg_[kSegments];  // [segment][sub-bucket], null until used
  uint64_t count_ = 0;
  double sum_ = 0;
  int64_t max_ = 0;
};

// Batch-means confidence intervals of the mean and of percentiles: the measured requests split
// by arrival time into `n` consecutive batches, each its own histogram; the interval is the full
// data's mean or percentile +- t(0.975, n-1) x the batches' standard deviation / sqrt(n). The
// mean's is given where every batch holds at least 20 values, a percentile's where every batch
// holds at least 20 values above it (p99: 2,000 a batch).
class BatchHists {
 public:
  explicit BatchHists(int n = 20) : h_(static_cast<size_t>(n)) {}
  void Record(double frac, int64_t v);  // frac in [0, 1): where in the window it arrived
  // {"mean_us": [lo, hi], "p50_us": [lo, hi], "p90_us": .., "p99_us": .., "batches": n} for
  // the figures it can give
  nlohmann::json Intervals(const Hist& all) const;

 private:
  std::vector<Hist> h_;
};

// ------------------------------------------------------------------ model

enum class QueueKind { kFifo, kEpoll, kSocket };
enum class Dist { kExp, kConst, kLognormal, kEmpirical };
enum class Lb { kRoundRobin, kRandom, kLeastLoaded, kConnection };
enum class Branch { kAll, kOne };

struct StageSpec {
  std::string name;
  QueueKind queue = QueueKind::kFifo;
  int batch = 1;             // fifo/socket: up to N jobs; epoll: up to N from each ready connection
  Dist dist = Dist::kExp;
  double mean_us = 1;        // mean for a batch of one job
  double per_job_us = 0;     // added per extra job in the batch
  double sigma = 0;          // lognormal shape
  std::vector<double> emp_values_us, emp_cdf;  // empirical histogram (cumulative weights)
  double emp_mean_us = 0;
  double bytes_per_job = 0;  // bytes_table: mean = step(bytes) for bytes = n * bytes_per_job
  std::vector<double> table_bytes, table_us;
  double dvfs_scale = 0;     // t * (1 - s + s * f_base / f)
};

struct InstanceSpec {
  int machine = 0;
  std::vector<int> cores;  // core ids on that machine the instance's threads may run on
};

struct ServiceSpec {
  std::string name;
  bool simple = false;       // every thread has a core of its own (no core contention)
  bool pinned = false;       // thread i runs only on cores[i % cores.size()]
  int threads = 1;
  double context_switch_us = 0;
  double freq_ratio = 1;     // f_base / f
  double time_scale = 1;     // every stage time x this (the qsim host backend's uncore factor)
  int connections = 1;
  Lb lb = Lb::kRoundRobin;
  std::vector<StageSpec> stages;
  std::vector<InstanceSpec> instances;
};

struct NodeSpec {
  int service = 0;
  std::vector<int> stages;      // stage indices run in order at this node
  std::vector<int> children;
  Branch branch = Branch::kAll;
  std::vector<double> child_cdf;  // for kOne
  int copies = 1;               // fan-out over distinct instances
  int join = 1;                 // arrivals needed before the node runs (sum of parents' copies)
  int join_slot = -1;           // index into the request's join counters (join > 1)
  bool hold_thread = false;     // the thread that ran this node blocks until release
  bool release_thread = false;  // runs on the thread held earlier at the same service
  int pool = 0;                 // > 0: calls into this node share that many blocking connections
  int pool_slot = -1;           // index of the node's connection pool (pool > 0)
};

struct PathSpec {
  double weight = 1;
  int root = 0;
  int join_slots = 0;
  std::vector<NodeSpec> nodes;
};

struct MachineSpec {
  std::string name;
  int cores = 1;
};

struct Epoch {
  double end_s;
  double qps;
};

struct ClientSpec {
  bool closed = false;
  std::vector<Epoch> epochs;  // open loop: piecewise-constant Poisson rate
  int users = 1;              // closed loop
  double think_us = 0;        // closed loop: exponential think time (0 = none)
  int connections = 1;
};

struct Model {
  uint64_t seed = 1;
  double duration_s = 1;
  double warmup_s = 0;
  uint64_t max_requests = 0;      // stop after this many completions (0 = no limit)
  uint64_t max_live_requests = 100000;
  uint64_t max_live_jobs = 4000000;
  bool no_fast_path = false;        // tests: run every instance through the event path
  double control_interval_s = 0;    // > 0: call the controller every interval (Simulate below)
  // > 0: a line "progress SIM_T_S END_S COMPLETED MAX_REQUESTS" on stderr at most this often
  // (wall seconds; checked every 65,536 events). Set by `musku_qsim --progress`, not the model.
  double progress_interval_s = 0;
  double net_latency_us = 0;        // between machines
  double local_latency_us = 0;      // same machine
  double client_latency_us = 0;     // client -> entry service
  double reply_latency_us = 0;      // last service -> client
  std::vector<MachineSpec> machines;
  std::vector<ServiceSpec> services;
  std::vector<PathSpec> paths;
  int pools = 0;  // connection pools (nodes with pool > 0)
  ClientSpec client;
};

Model ParseModel(const nlohmann::json& j);  // throws ModelError

// A run-time controller (a power manager): called every control_interval_s of simulated time
// with the interval's figures {t_s, count, mean_us, p99_us, services: [{name, count, mean_us,
// p99_us, busy_core_s, cores, freq_ratio}]}; it answers {} or {"freq_ratio": [per service
// f_base / f]} (the services' DVFS from then on) or {"stop": true}.
using Controller = std::function<nlohmann::json(const nlohmann::json&)>;

// Runs the model; returns the result document (docs/qsim.md "Results").
nlohmann::json Simulate(const Model& m);
nlohmann::json Simulate(const Model& m, const Controller& control);

}  // namespace musku::qsim
