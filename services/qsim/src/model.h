// The normalised model the engine runs (JSON written by musku/qsim/model.py, which validates
// the user's TOML; parsed and checked again by ParseModel in model.cc). Every timing rule is
// data here, never a formula in the engine.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace musku::qsim {

// Thrown for a malformed normalised model (the CLI maps it to exit status 3).
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
  // How a finished batch's jobs enter the instance's next stage (docs/qsim.md "Queue kinds"):
  // false = in batch order; true = μqSim's order (Sim::UqsimHandoff in sim_uqsim.cc).
  bool handoff_uqsim = false;
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
  bool reply = false;           // an ancestor node runs on the same service (μqSim's waitResp)
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
  bool no_stage_fusion = false;     // tests: every stage change through the queues (Sim::Fuse)
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

}  // namespace musku::qsim
