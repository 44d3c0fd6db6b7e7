// musku load generator: open loop (exponential inter-arrival gaps, every latency measured from
// the request's INTENDED send time) or closed loop (N outstanding), over gRPC's generic stub so
// one binary drives any service; per-service request plug-ins turn a data file into requests.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "musku/histogram.h"

namespace loadgen {

struct Workload {
  std::string method;                      // "/package.Service/Method" (of every request, unless `methods`)
  std::vector<grpc::ByteBuffer> requests;  // serialized requests, used round-robin
  // Mixed workloads (router: Get + Set): request i goes to methods[method_of[i]].
  std::vector<std::string> methods;
  std::vector<std::uint8_t> method_of;  // parallel to `requests` when `methods` is set
  // A load phase (YCSB's): requests [0, preload) are sent once, before the warm-up, with
  // --concurrency outstanding, unmeasured, and must all succeed; the run cycles over the rest.
  std::size_t preload = 0;

  const std::string& MethodOf(std::size_t i) const { return methods.empty() ? method : methods[method_of[i]]; }
  // The request sent as the n-th of the run (after the load phase).
  std::size_t RunIndex(std::uint64_t n) const { return preload + static_cast<std::size_t>(n % (requests.size() - preload)); }
  std::string Check() const;  // "" or what is inconsistent
};

// A plug-in builds a workload from a file; returns "" or why not.
using Plugin = std::function<std::string(const std::string& path, Workload* out)>;
std::map<std::string, Plugin>& Plugins();  // name -> plug-in (built-ins registered in plugins.cc)
void RegisterBuiltinPlugins();

// Generic: a file of length-prefixed (u32 little-endian) serialized requests.
std::string LoadLengthPrefixed(const std::string& path, const std::string& method, Workload* out);

// ---- YCSB-style key/value workloads (the router plug-in) -------------------------------------

// Zipf(theta) over ranks 0..n-1 (rank r with probability ~ 1/(r+1)^theta; theta 0 = uniform),
// by inverse CDF: exact, O(log n) a sample.
class Zipf {
 public:
  Zipf(uint64_t n, double theta);
  uint64_t Sample(std::mt19937_64& rng) const;

 private:
  std::vector<double> cdf_;
};

// A workload spec file: "field value" (or field=value) lines, '#' comments; defaults = YCSB
// workload A (50/50 read/update, Zipf 0.99 request distribution).
struct YcsbSpec {
  double records = 1000;        // keys user0..user{records-1}, each set once in the load phase
  double operations = 100000;   // run-phase operations (cycled by the generator)
  double read_proportion = 0.5; // gets; the rest are sets
  double zipf = 0.99;           // key popularity skew (0 = uniform)
  double value_bytes = 128;
  double seed = 1;
};
std::string ParseYcsbSpec(const std::string& path, YcsbSpec* out);  // "" or why not

struct YcsbOps {
  std::vector<uint64_t> key;   // record id of each operation
  std::vector<bool> is_read;
};
// Seeded: the same spec gives the same operations. Popularity ranks are mapped to record ids by
// a seeded permutation (YCSB's scrambled Zipf: the hot keys are not the smallest ids).
YcsbOps GenerateYcsb(const YcsbSpec& spec);
std::string YcsbKey(uint64_t id);  // "user<id>"

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
  std::map<std::string, uint64_t> methods;  // completions per method (mixed workloads only)
};

struct Result {
  std::vector<PhaseResult> phases;  // closed loop: one
  PhaseResult total;
  uint64_t late_sends = 0;  // open loop: sends more than 1 ms behind schedule (generator overload)
  // Open loop: how late each send left against its intended time (ns). Latencies count from the
  // intended time, so this lag is inside them: it says how much of a low-load latency is the
  // generator's own wake-up (timer, an idle vCPU), not the service.
  musku::Histogram send_lag;
  uint64_t preloaded = 0;   // load-phase requests sent (all succeeded)
  uint64_t warmup_answered = 0;  // warm-up requests answered (ok or not), not in any phase
};

// Runs the load; returns "" or an error (e.g. target unreachable).
std::string Run(const Options& opt, const Workload& w, Result* out);

std::string ToJson(const Options& opt, const Result& r);

}  // namespace loadgen
