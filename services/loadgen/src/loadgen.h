// musku load generator: open loop (exponential inter-arrival gaps, every latency measured from
// the request's INTENDED send time) or closed loop (N outstanding), over gRPC's generic stub so
// one binary drives any service; per-service request plug-ins turn a data file into requests.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "musku/histogram.h"

namespace loadgen {

struct Workload {
  std::string method;                      // "/package.Service/Method"
  std::vector<grpc::ByteBuffer> requests;  // serialized requests, used round-robin
};

// A plug-in builds a workload from a file; returns "" or why not.
using Plugin = std::function<std::string(const std::string& path, Workload* out)>;
std::map<std::string, Plugin>& Plugins();  // name -> plug-in (built-ins registered in plugins.cc)
void RegisterBuiltinPlugins();

// Generic: a file of length-prefixed (u32 little-endian) serialized requests.
std::string LoadLengthPrefixed(const std::string& path, const std::string& method, Workload* out);

struct Phase {
  double qps = 0;
  double seconds = 0;
};
// "100:2,5000:1,100:2" -> phases; "" on success.
std::string ParseSchedule(const std::string& s, std::vector<Phase>* out);

// Exponential gaps for a rate; deterministic with a seed.
class Arrivals {
 public:
  Arrivals(uint64_t seed) : rng_(seed) {}
  int64_t NextGapNs(double qps) {
    std::exponential_distribution<double> d(qps);
    return static_cast<int64_t>(d(rng_) * 1e9);
  }

 private:
  std::mt19937_64 rng_;
};

struct Options {
  std::string target;
  std::string mode = "open";  // open | closed
  std::vector<Phase> phases;  // open loop; warm-up runs at phases[0].qps
  double warmup_s = 1;
  double duration_s = 10;     // closed loop
  int concurrency = 16;       // closed loop
  int channels = 1;
  int cq_threads = 1;
  int timeout_ms = 5000;
  uint64_t seed = 1;
};

struct PhaseResult {
  Phase phase;
  uint64_t sent = 0, ok = 0, errors = 0;
  double window_s = 0;
  musku::Histogram latency;  // ns, from intended send time
  std::map<int, uint64_t> codes;
};

struct Result {
  std::vector<PhaseResult> phases;  // closed loop: one
  PhaseResult total;
  uint64_t late_sends = 0;  // open loop: sends more than 1 ms behind schedule (generator overload)
};

// Runs the load; returns "" or an error (e.g. target unreachable).
std::string Run(const Options& opt, const Workload& w, Result* out);

std::string ToJson(const Options& opt, const Result& r);

}  // namespace loadgen
