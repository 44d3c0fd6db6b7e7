// The engine behind musku::Server: thread pools and completion queues (threads.cc), per-RPC
// contexts and the life cycle (engine.cc), threading control and auto (control.cc). It knows
// calls only as CallBase / StreamCall: the Admin service (admin.cc) and the batch transport's
// leaf end (batch_leaf.cc) are built on it, never the other way round.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "auto_policy.h"
#include "musku/framework.h"
#include "musku/histogram.h"

namespace musku::detail {

// Pinning specification "p:0,w:1+2,r:1" -> per pool the CPUs (empty = not pinned).
struct PinSpec {
  std::vector<int> pollers, workers, responders;
};
bool ParsePinSpec(const std::string& s, PinSpec* out, std::string* error);

// A call that lives as long as a stream (the leaf end of the batch transport): the engine keeps
// it from StreamStarted to Retire and asks it to Close at shutdown.
class StreamCall : public CallBase {
 public:
  // Shutdown: end the stream once the work already read is answered.
  virtual void Close() = 0;
};

class Engine {
 public:
  Engine(ServerOptions opts, Role role);
  ~Engine();

  void RegisterService(grpc::Service* svc) {  // once per service, however many methods
    if (std::find(services_.begin(), services_.end(), svc) == services_.end()) services_.push_back(svc);
  }
  void AddFactory(std::function<std::unique_ptr<CallBase>()> f, bool admin, int per_cq);

  bool Start(std::string* error);
  void Wait();
  void RequestStop();
  void Shutdown();

  // threading
  std::string SetThreading(const Threading& t);
  std::string SetAuto(const std::string& path);
  Threading Current() const;
  bool auto_mode() const { return auto_.load(std::memory_order_acquire); }
  std::string table_path() const;
  std::string last_error() const;
  uint64_t switches() const { return switches_.load(std::memory_order_relaxed); }
  struct SwitchRecord {
    int64_t at_ns;
    std::string from, to, reason;
    double qps;
    int64_t backlog;
  };
  static constexpr size_t kSwitchLog = 32;
  std::vector<SwitchRecord> RecentSwitches() const;  // oldest first
  double MeasuredQps() const { return estimator_.Estimate(MonotonicNs()); }

  LeafCallMode leaf_mode() const {
    return static_cast<LeafCallMode>(leaf_mode_.load(std::memory_order_acquire));
  }
  int responders_in_use() const { return n_responders_.load(std::memory_order_acquire); }
  WaitMode wait_mode() const {
    return static_cast<WaitMode>(wait_mode_.load(std::memory_order_acquire));
  }
  grpc::CompletionQueue* PickResponder(CallBase* call, int n);
  void NoteFinish(CallBase* call, const grpc::Status& st);
  void NoteLeafErrors(int n) { leaf_errors_.fetch_add(static_cast<uint64_t>(n)); }
  void SetWorkerChooser(std::function<int(int)> fn) { chooser_ = std::move(fn); }

  // Streams (the batch transport's leaf end, batch_leaf.cc). A stream holds its context for its
  // whole life: arm a replacement, and remember it so that Shutdown can close it.
  void StreamStarted(StreamCall* c);
  // The stream's last operation completed: recycle its context (what kFinish does for a unary).
  void Retire(StreamCall* c);
  // `n` calls arrived in one batch at `now` (load estimate, auto), and one of them finished.
  void NoteArrivals(int n, int64_t now);
  void NoteItem(int64_t arrival_ns, bool ok);
  void NotePhase(Phase p, int64_t wall_ns, int64_t cpu_ns) {
    phase_hist_[p].Record(wall_ns);
    phase_cpu_ns_[p].fetch_add(cpu_ns, std::memory_order_relaxed);
  }
  static constexpr const char* kPhaseNames[kPhases] = {"queue", "handler", "leaf_wait", "finalize"};
  // Runs `job` here (inline models) or hands it to a worker (dispatch models).
  void RunOrDispatch(CallBase* job, Exec& exec);

  // stats
  const ServerOptions& opts() const { return opts_; }
  Role role() const { return role_; }
  int port() const { return port_; }
  double UptimeS() const { return static_cast<double>(MonotonicNs() - start_ns_) / 1e9; }
  int thread_count() const;

  struct Snapshot {
    uint64_t requests, errors, leaf_errors;
    double window_s;
    Histogram hist;
    Histogram phase_hist[kPhases];  // wall time per phase
    int64_t phase_cpu_ns[kPhases];  // summed thread CPU time per phase
  };
  Snapshot TakeStats(bool reset);

 private:
  class ThreadExec;
  struct Factory {
    std::function<std::unique_ptr<CallBase>()> make;
    bool admin;
    int per_cq;
  };
  struct Poller;
  struct Worker;
  struct Responder;

  void PollerLoop(int k);
  void WorkerLoop(int w);
  void ResponderLoop(int r);
  void HandleServerTag(int k, Tag* tag, bool ok, Exec& exec);
  void Recycle(CallBase* call, int k);
  void EndInflight();  // an admitted RPC or stream is done
  void ArmOn(int k, size_t f, int count);
  void Dispatch(CallBase* call);
  void MaybeAuto(int64_t now);
  // `qps`: the load the change acted on (< 0: the current estimate), for the switch log.
  std::string ApplyLocked(const Threading& t, const char* reason, double qps = -1);
  void Pin(const std::vector<int>& cpus, int index, const char* pool);
  void CloseStreams();

  ServerOptions opts_;
  Role role_;
  std::vector<grpc::Service*> services_;
  std::vector<Factory> factories_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int64_t start_ns_;
  PinSpec pin_;

  // configuration in force (read lock-free on the hot path)
  std::atomic<int> leaf_mode_{0}, dispatch_mode_{0}, wait_mode_{0};
  std::atomic<int> n_pollers_{1}, n_workers_{0}, n_responders_{0};
  mutable std::mutex config_mu_;
  std::atomic<bool> auto_{false};
  DecisionTable table_;
  size_t table_row_ = 0;
  int64_t table_row_since_ns_ = 0;  // when auto chose table_row_
  OverloadGuard overload_;  // auto: backlog seen, on the peak-load row until it has drained
  Persistence rise_;        // auto: the current run of decisions to move up a row
  std::atomic<int64_t> last_auto_ns_{0};
  std::string last_error_;
  std::atomic<uint64_t> switches_{0};
  std::deque<SwitchRecord> switch_log_;  // under config_mu_
  LoadEstimator estimator_;

  std::vector<std::unique_ptr<Poller>> pollers_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Responder>> responders_;
  std::atomic<uint32_t> rr_worker_{0}, rr_responder_{0}, rr_poller_{0};
  std::function<int(int)> chooser_;

  // per-RPC contexts: owned here, reused
  std::mutex calls_mu_;
  std::vector<std::unique_ptr<CallBase>> all_calls_;
  std::vector<std::vector<CallBase*>> free_calls_;  // per factory
  std::vector<size_t> factory_of_;                   // parallel to all_calls_ (by index)

  // in flight + shutdown
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> inflight_{0};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
  bool shut_down_ = false;
  std::thread signal_thread_;
  std::atomic<bool> signal_thread_exit_{false};

  // streams
  std::mutex streams_mu_;
  std::set<StreamCall*> streams_;  // started, not yet retired

  // stats
  std::mutex stats_mu_;
  Histogram hist_;
  Histogram phase_hist_[kPhases];
  std::atomic<int64_t> phase_cpu_ns_[kPhases] = {};
  std::atomic<uint64_t> requests_{0}, errors_{0}, leaf_errors_{0};
  std::atomic<int64_t> window_start_ns_{0};
};

}  // namespace musku::detail
