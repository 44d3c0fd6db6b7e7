// The simulator (docs/qsim.md "Engine"). // Internal to the engine (not part of engine.h's API). Its methods are spread by
// job: sim_setup.cc (building the run), sim_events.cc (the event loop and every handler on the
// hot path, in one translation unit so that they inline into each other), sim_result.cc (the
// overload verdict and the result document), sim_control.cc (a controller's intervals and the
// progress lines), simulate.cc (Run and the public entry points).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine.h"
#include "event_heap.h"
#include "pool.h"
#include "runtime.h"

namespace musku::qsim::internal {

class Sim {
 public:
  explicit Sim(const Model& m, const Controller* control = nullptr) : m_(m), control_(control) {}
  nlohmann::json Run();  // Setup, Loop, Result (simulate.cc)

 private:
  void Setup();                          // streams, instances, threads, first events (sim_setup.cc)
  void Loop();                           // the event loop (sim_events.cc)
  nlohmann::json Result(double cpu_s);   // the overload verdict and the result (sim_result.cc)

 private:
  // streams
  enum : uint64_t { kStreamArrival = 1, kStreamPath = 2, kStreamLb = 3, kStreamBranch = 4, kStreamConn = 5, kStreamStage = 1000 };

  void Push(double t, EvType type, int a = 0, int b = 0, void* p = nullptr) {
    heap_.push(Event{t, (seq_++ << 8) | type, p, a, b});
  }
  double Latency(int from_machine, int to_machine) const {
    if (from_machine < 0) return m_.client_latency_us * 1000.0;
    return (from_machine == to_machine ? m_.local_latency_us : m_.net_latency_us) * 1000.0;
  }
  // Latency's three values computed once at set-up (the same values; not a table per machine
  // pair: the imported fan-out has 1,001 machines, 8 MB of it cost its set-up 0.2M cache misses)
  double HopNs(int from_machine, int to_machine) const {
    if (from_machine < 0) return client_ns_;
    return from_machine == to_machine ? local_ns_ : net_ns_;
  }
  // The instance a node's job goes to (Place's choice): its fan-out copy's, or base + conn %
  // ninst for a node whose service binds connections (or has one instance: NodeRt::by_conn),
  // else the request's sticky one or the load balancer's (then sticky from now on).
  int PlaceInst(Request* r, const NodeRt& cn, int copy) {
    if (copy >= 0) return cn.base + copy % cn.ninst;
    if (cn.by_conn) return cn.base + r->conn % cn.ninst;
    int& sticky = r->sticky[static_cast<size_t>(cn.service)];
    const int inst = sticky >= 0 ? sticky : Route(r, cn.service);
    sticky = inst;
    return inst;
  }
  int Route(Request* r, int service);
  void NewRequest(int user);
  void Spawn(Request* r, int node, int from_machine, double now, int copy);
  void Place(Job* j, Request* r, const NodeRt& cn, int from_machine, double now, int copy);
  void Enqueue(Job* j);
  void Enqueue2(Job* j, Request* r, const NodeSpec& n, Instance& in);
  void EnqueueQ(Job* j, const NodeSpec& n, Instance& in);
  void QueueChange(StageQ& q, long delta) {
    q.area += static_cast<double>(q.len) * (now_ - std::max(q.last, measure_start_));
    q.last = now_;
    q.len = static_cast<size_t>(static_cast<long>(q.len) + delta);
    if (q.len > q.max_len) q.max_len = q.len;
  }
  void Wake(Instance& in);
  void MakeRunnable(int tid);
  void Grant(int tid, int core);
  void StartWork(int tid);
  void RunBatch(int tid, Thread& t, Instance& in, const ServiceSpec& sv);  // StartWork's end
  bool Fuse(int tid, Thread& t, Instance& in);  // a job's next stage on the same thread (Done)
  double Chain(Thread& t, Instance& in, const ServiceSpec& sv, double end);  // RunBatch: stages ahead
  double ChainSteps(Thread& t, Instance& in, double upto);  // a chain's stage changes up to a time
  void EndChains();  // the end of the run: stage changes a chain passed before it (Loop)
  bool SomeoneWaits(const MachineRt& mc, int core) const;  // a runnable thread for this core
  void Done(int tid);
  void ReleaseCore(int tid);
  void UqsimHandoff(std::vector<Job*>& batch);  // μqSim's order for a finished batch (sim_uqsim.cc)
  void FinishNode(Job* j, double t);
  void Complete(Request* r);
  double Lindley(Job* j, Instance& in);  // the job's departure (its caller finishes the node then)
  // A batch of n jobs' service time (ns). The common cases inline: an exponential time without
  // a size table, or with one whose entries cover the batch's bytes (no repeat: a poll of a few
  // ready connections, a read of a few jobs); the rest in ServiceTimeGeneral. Both end in
  // ScaleTime: the same operations in the same order as one function, so the same values bit
  // for bit.
  double ServiceTime(const StageSpec& st, const ServiceSpec& sv, size_t n, Rng& rng) {
    if (st.dist == Dist::kExp) {
      double mean;
      if (st.table_bytes.empty()) {
        mean = st.mean_us + st.per_job_us * static_cast<double>(n - 1);
      } else {
        const double bytes = st.bytes_per_job * static_cast<double>(n);
        const size_t size = st.table_bytes.size();
        size_t i = 0;
        while (i < size && st.table_bytes[i] < bytes) ++i;
        if (i == size) return ServiceTimeGeneral(st, sv, n, rng);  // past the table: repeats
        mean = st.table_us[i];
      }
      double total = 0;
      total += rng.Exp(mean);
      return ScaleTime(total, st, sv);
    }
    return ServiceTimeGeneral(st, sv, n, rng);
  }
  double ServiceTimeGeneral(const StageSpec& st, const ServiceSpec& sv, size_t n, Rng& rng);
  double ScaleTime(double total, const StageSpec& st, const ServiceSpec& sv) const {
    if (st.dvfs_scale > 0)
      total *= 1.0 - st.dvfs_scale + st.dvfs_scale * freq_ratio_[static_cast<size_t>(&sv - m_.services.data())];
    return total * sv.time_scale * 1000.0;  // ns
  }
  void Stop(const std::string& why, bool saturated) {
    if (!stopped_) {
      stopped_ = true;
      stop_reason_ = why;
      saturated_ = saturated;
    }
  }

  void Control();  // a controller's interval (Simulate with a Controller)
  void Progress();  // a progress line on stderr when its wall-clock interval has passed

  // events between two looks at the wall clock for progress (a mask: one AND per event)
  static constexpr uint64_t kProgressMask = (uint64_t{1} << 16) - 1;
  std::chrono::steady_clock::time_point progress_next_{};

  const Model& m_;
  const Controller* control_;
  std::vector<double> freq_ratio_;  // per service: f_base / f now (the controller may change it)
  Hist win_e2e_;                    // the controller's interval
  std::vector<Hist> win_svc_;
  std::vector<double> win_busy_mark_;  // per thread: busy_time at the interval's start
  std::vector<PoolRt> pools_;
  EventHeap heap_;
  uint64_t seq_ = 0;
  double now_ = 0, end_ = 0, warmup_ = 0, measure_start_ = 0;
  bool stopped_ = false, saturated_ = false;
  std::string stop_reason_;
  Rng rng_arrival_, rng_path_, rng_lb_, rng_branch_, rng_conn_;
  std::vector<std::vector<double>> svc_freq_factor_;
  std::vector<MachineRt> machines_;
  std::vector<Instance> inst_;
  std::vector<int> svc_first_inst_;
  std::vector<size_t> svc_rr_;
  std::vector<Thread> threads_;
  Pool<Request> req_pool_;
  Pool<Job> job_pool_;
  std::vector<double> path_cdf_;
  std::vector<std::vector<NodeRt>> node_rt_;  // per path, per node: the compiled path (NodeRt)
  std::vector<int> inst_machine_;             // per instance: its machine
  double client_ns_ = 0, local_ns_ = 0, net_ns_ = 0;  // Latency's values (HopNs)
  bool need_sticky_ = false;  // a service's instance may depend on the request's history
  bool need_held_ = false;    // a node holds or releases a thread
  uint64_t live_requests_ = 0, live_jobs_ = 0, events_ = 0, stage_runs_ = 0, jobs_run_ = 0;
  uint64_t issued_ = 0, completed_ = 0, completed_measured_ = 0, issued_measured_ = 0;
  int epoch_ = 0;
  Hist e2e_;
  BatchHists batches_;
  std::vector<Hist> svc_hist_;
  // Overload: the requests in the system (issued, not yet answered) at the start of the
  // measured window, half-way and at its end. A request a Lindley instance answers is counted
  // by the time it is answered, not by when the engine computed that time.
  double sample_t_[3] = {0, 0, 0};
  uint64_t issued_by_[3] = {0, 0, 0}, done_by_[3] = {0, 0, 0};
  bool mid_seen_ = false;
};

// The process's peak resident set (simulate.cc).
long PeakRssKib();

}  // namespace musku::qsim::internal
