#include "engine.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <absl/synchronization/mutex.h>
#include <nlohmann/json.hpp>
#include <sstream>

#include "musku/admin.grpc.pb.h"
#include "musku/log.h"

namespace musku::detail {

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {
thread_local std::chrono::system_clock::time_point call_deadline =
    std::chrono::system_clock::time_point::max();
}  // namespace

DeadlineScope::DeadlineScope(std::chrono::system_clock::time_point deadline)
    : saved_(call_deadline) {
  call_deadline = deadline;
}
DeadlineScope::~DeadlineScope() { call_deadline = saved_; }

}  // namespace musku::detail

namespace musku {
std::chrono::system_clock::time_point CallDeadline() { return detail::call_deadline; }
}  // namespace musku

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
    if (!j.is_object() || j.value("format", "") != "musku-threading-table/1")
      return "threading table " + path + " has no format \"musku-threading-table/1\"";
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

bool ParsePinSpec(const std::string& s, PinSpec* out, std::string* error) {
  *out = PinSpec{};
  if (s.empty()) return true;
  std::stringstream ss(s);
  std::string item;
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  while (std::getline(ss, item, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos || colon == 0) {
      *error = "--pin takes POOL:CPU[+CPU],... with POOL p|w|r, bad entry '" + item + "'";
      return false;
    }
    std::vector<int>* dst = nullptr;
    switch (item[0]) {
      case 'p': dst = &out->pollers; break;
      case 'w': dst = &out->workers; break;
      case 'r': dst = &out->responders; break;
      default: *error = "--pin: unknown pool in '" + item + "' (p, w or r)"; return false;
    }
    std::stringstream cs(item.substr(colon + 1));
    std::string cpu;
    while (std::getline(cs, cpu, '+')) {
      char* end = nullptr;
      long c = std::strtol(cpu.c_str(), &end, 10);
      if (cpu.empty() || *end || c < 0 || c >= ncpu) {
        *error = "--pin: bad CPU '" + cpu + "' (this host has " + std::to_string(ncpu) + ")";
        return false;
      }
      dst->push_back(static_cast<int>(c));
    }
  }
  return true;
}

// ------------------------------------------------------------------------------------------
// Threads

class Engine::ThreadExec final : public Exec {
 public:
  explicit ThreadExec(Engine* e) : e_(e) {}
  ~ThreadExec() override {
    cq_.Shutdown();
    void* t;
    bool ok;
    while (cq_.Next(&t, &ok)) {
    }
  }
  grpc::CompletionQueue* private_cq() override { return &cq_; }
  WaitMode wait_mode() const override { return e_->wait_mode(); }

 private:
  Engine* e_;
  grpc::CompletionQueue cq_;
};

struct Engine::Poller {
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::vector<std::atomic<int>> armed;  // per factory
  std::thread th;
  explicit Poller(size_t nf) : armed(nf) {
    for (auto& a : armed) a.store(0);
  }
};

struct Engine::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<CallBase*> q;
  bool stop = false;
  std::thread th;
};

struct Engine::Responder {
  grpc::CompletionQueue cq;
  std::thread th;
};

Engine::Engine(ServerOptions opts, Role role)
    : opts_(std::move(opts)), role_(role), start_ns_(MonotonicNs()) {
  window_start_ns_ = start_ns_;
}

Engine::~Engine() { Shutdown(); }

void Engine::AddFactory(std::function<std::unique_ptr<CallBase>()> f, bool admin, int per_cq) {
  factories_.push_back(Factory{std::move(f), admin, per_cq});
  free_calls_.emplace_back();
}

void Engine::Pin(const std::vector<int>& cpus, int index, const char* pool) {
  if (cpus.empty()) return;
  const int cpu = cpus[static_cast<size_t>(index) % cpus.size()];
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
    LogError("%s: cannot pin %s %d to CPU %d", opts_.service.c_str(), pool, index, cpu);
  else
    LogInfo("%s: placement %s%d -> cpu%d", opts_.service.c_str(), pool, index, cpu);
}

void Engine::ArmOn(int k, size_t f, int count) {
  Poller& p = *pollers_[static_cast<size_t>(k)];
  for (int i = 0; i < count; ++i) {
    CallBase* c = nullptr;
    {
      std::lock_guard<std::mutex> lk(calls_mu_);
      auto& fl = free_calls_[f];
      if (!fl.empty()) {
        c = fl.back();
        fl.pop_back();
      } else {
        all_calls_.push_back(factories_[f].make());
        c = all_calls_.back().get();
        c->engine = this;
        c->factory = f;
        c->admin = factories_[f].admin;
        c->counted = !factories_[f].admin;
      }
    }
    c->cq_index = k;
    p.armed[f].fetch_add(1);
    c->Arm(p.cq.get());
  }
}

bool Engine::Start(std::string* error) {
  if (std::string unknown = opts_.UnreadFlags(); !unknown.empty()) {
    *error = "unknown flag(s) " + unknown + " (see --help)";
    return false;
  }
  if (!ParsePinSpec(opts_.pin, &pin_, error)) return false;
  // Debian's abseil runs mutex deadlock detection (a lock graph updated on every gRPC mutex
  // acquisition: ~6 % of a mid-tier's CPU in perf). It is a debugging aid: off in servers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(opts_.listen, grpc::InsecureServerCredentials(), &port_);
  AddBatchService();
  for (auto* s : services_) builder.RegisterService(s);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  const size_t nf = factories_.size();
  for (int k = 0; k < opts_.max_pools.pollers; ++k) {
    auto p = std::make_unique<Poller>(nf);
    p->cq = builder.AddCompletionQueue();
    pollers_.push_back(std::move(p));
  }
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    *error = "cannot listen on " + opts_.listen + " (address in use or invalid)";
    server_.reset();
    pollers_.clear();
    return false;
  }
  Threading t = opts_.threading;
  if (opts_.auto_threading) {
    DecisionTable table;
    std::string why = LoadDecisionTable(opts_.threading_table, opts_.service, opts_.max_pools,
                                        &table, opts_.leaf_transport);
    if (!why.empty()) {
      last_error_ = why;
      LogError("%s: --threading auto: %s; running %s", opts_.service.c_str(), why.c_str(),
               t.ToString().c_str());
    } else {
      table_ = std::move(table);
      table_row_ = 0;
      t = table_.rows[0].threading;
      auto_ = true;
    }
  }
  leaf_mode_ = static_cast<int>(t.model.leaf);
  dispatch_mode_ = static_cast<int>(t.model.dispatch);
  wait_mode_ = static_cast<int>(t.model.wait);
  n_pollers_ = t.pools.pollers;
  n_workers_ = t.pools.workers;
  n_responders_ = t.pools.responders;
  for (int k = 0; k < t.pools.pollers; ++k)
    for (size_t f = 0; f < nf; ++f) ArmOn(k, f, factories_[f].per_cq);
  for (int w = 0; w < opts_.max_pools.workers; ++w) workers_.push_back(std::make_unique<Worker>());
  for (int r = 0; r < opts_.max_pools.responders; ++r)
    responders_.push_back(std::make_unique<Responder>());
  for (int k = 0; k < static_cast<int>(pollers_.size()); ++k)
    pollers_[static_cast<size_t>(k)]->th = std::thread([this, k] { PollerLoop(k); });
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w)
    workers_[static_cast<size_t>(w)]->th = std::thread([this, w] { WorkerLoop(w); });
  for (int r = 0; r < static_cast<int>(responders_.size()); ++r)
    responders_[static_cast<size_t>(r)]->th = std::thread([this, r] { ResponderLoop(r); });
  signal_thread_ = std::thread([this] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    int sig = 0;
    sigwait(&set, &sig);
    if (!signal_thread_exit_.load()) {
      LogInfo("%s: signal %d, shutting down", opts_.service.c_str(), sig);
      RequestStop();
    }
  });
  if (!opts_.port_file.empty()) {
    const std::string tmp = opts_.port_file + ".tmp";
    {
      std::ofstream pf(tmp);
      pf << port_ << "\n";
    }
    if (std::rename(tmp.c_str(), opts_.port_file.c_str()) != 0)
      LogError("%s: cannot write --port-file %s", opts_.service.c_str(), opts_.port_file.c_str());
  }
  LogInfo("%s: listening on port %d, threading %s%s", opts_.service.c_str(), port_,
          opts_.auto_threading && auto_ ? "auto, now " : "", t.ToString().c_str());
  return true;
}

void Engine::RequestStop() {
  std::lock_guard<std::mutex> lk(stop_mu_);
  stop_requested_ = true;
  stop_cv_.notify_all();
}

void Engine::Wait() {
  std::unique_lock<std::mutex> lk(stop_mu_);
  stop_cv_.wait(lk, [this] { return stop_requested_; });
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_requested_ = true;
    stop_cv_.notify_all();
  }
  shutting_down_ = true;
  CloseStreams();  // batch streams end once their work is written; unary calls get the grace
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(opts_.shutdown_grace_ms));
    // In-flight RPCs (already cancelled past the grace period) still get their Finish tags.
    std::unique_lock<std::mutex> lk(stop_mu_);
    stop_cv_.wait_for(lk, std::chrono::milliseconds(opts_.leaf_timeout_ms + 2000),
                      [this] { return inflight_.load() <= 0; });
    if (inflight_.load() > 0)
      LogError("%s: %lld RPCs still in flight at shutdown", opts_.service.c_str(),
               static_cast<long long>(inflight_.load()));
  }
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lk(w->mu);
      w->stop = true;
    }
    w->cv.notify_all();
  }
  for (auto& w : workers_)
    if (w->th.joinable()) w->th.join();
  for (auto& r : responders_) r->cq.Shutdown();
  for (auto& r : responders_)
    if (r->th.joinable()) r->th.join();
  for (auto& p : pollers_)
    if (p->cq) p->cq->Shutdown();
  for (auto& p : pollers_)
    if (p->th.joinable()) p->th.join();
  if (signal_thread_.joinable()) {
    signal_thread_exit_ = true;
    pthread_kill(signal_thread_.native_handle(), SIGTERM);
    signal_thread_.join();
  }
  server_.reset();
  pollers_.clear();
  std::lock_guard<std::mutex> lk(calls_mu_);
  for (auto& fl : free_calls_) fl.clear();
  all_calls_.clear();
}

void Engine::PollerLoop(int k) {
  Pin(pin_.pollers, k, "poller");
  Poller& p = *pollers_[static_cast<size_t>(k)];
  ThreadExec exec(this);
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    const bool poll = wait_mode() == WaitMode::kPoll && k < n_pollers_.load(std::memory_order_relaxed) &&
                      !shutting_down_.load(std::memory_order_relaxed);
    if (poll) {
      auto st = p.cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (st == grpc::CompletionQueue::SHUTDOWN) break;
      if (st == grpc::CompletionQueue::TIMEOUT) {
        sched_yield();  // still polling, but a runnable thread on this core gets to run
        continue;
      }
    } else if (!p.cq->Next(&tag, &ok)) {
      break;
    }
    HandleServerTag(k, static_cast<Tag*>(tag), ok, exec);
  }
}

void Engine::HandleServerTag(int k, Tag* tag, bool ok, Exec& exec) {
  CallBase* c = tag->call;
  if (tag->kind == Tag::kNew) {
    pollers_[static_cast<size_t>(c->cq_index)]->armed[c->factory].fetch_sub(1);
    if (!ok) {  // server shutting down: this context was never matched with an RPC
      std::lock_guard<std::mutex> lk(calls_mu_);
      free_calls_[c->factory].push_back(c);
      return;
    }
    inflight_.fetch_add(1);
    const int64_t now = MonotonicNs();
    c->arrival_ns = now;
    if (c->counted) {
      estimator_.Record(now);
      if (auto_.load(std::memory_order_relaxed)) MaybeAuto(now);
    }
    if (c->admin || dispatch_mode_.load(std::memory_order_acquire) ==
                        static_cast<int>(DispatchMode::kInline))
      c->Run(exec);
    else
      Dispatch(c);
    return;
  }
  if (tag->kind == Tag::kFinish) {
    Recycle(c, k);
    EndInflight();
    return;
  }
  if (tag->kind == Tag::kRead || tag->kind == Tag::kWrite) {  // a batch stream (leaf end)
    c->OnStreamEvent(tag->kind, ok, exec);
    return;
  }
  c->OnLeafDone(tag->slot, ok);  // kLeaf: an async leaf reply (no response threads)
}

void Engine::Retire(CallBase* c) {
  {
    std::lock_guard<std::mutex> lk(streams_mu_);
    streams_.erase(c);
  }
  Recycle(c, c->cq_index);
  EndInflight();
}

void Engine::EndInflight() {
  if (inflight_.fetch_sub(1) == 1 && shutting_down_.load()) {  // Shutdown waits for none left
    std::lock_guard<std::mutex> lk(stop_mu_);
    stop_cv_.notify_all();
  }
}

void Engine::RunOrDispatch(CallBase* job, Exec& exec) {
  if (dispatch_mode_.load(std::memory_order_acquire) == static_cast<int>(DispatchMode::kInline))
    job->Run(exec);
  else
    Dispatch(job);
}

void Engine::Recycle(CallBase* c, int k) {
  const size_t f = c->factory;
  if (!shutting_down_.load()) {
    const int n = std::max(1, n_pollers_.load(std::memory_order_acquire));
    const int target = k < n ? k : static_cast<int>(rr_poller_.fetch_add(1) % static_cast<uint32_t>(n));
    Poller& p = *pollers_[static_cast<size_t>(target)];
    if (p.armed[f].load() < factories_[f].per_cq) {
      c->cq_index = target;
      p.armed[f].fetch_add(1);
      c->Arm(p.cq.get());
      return;
    }
  }
  std::lock_guard<std::mutex> lk(calls_mu_);
  free_calls_[f].push_back(c);
}

void Engine::Dispatch(CallBase* c) {
  const int n = std::max(1, n_workers_.load(std::memory_order_acquire));
  int w = chooser_ ? chooser_(n) : static_cast<int>(rr_worker_.fetch_add(1) % static_cast<uint32_t>(n));
  if (w < 0 || w >= static_cast<int>(workers_.size())) w = 0;
  Worker& wk = *workers_[static_cast<size_t>(w)];
  {
    std::lock_guard<std::mutex> lk(wk.mu);
    wk.q.push_back(c);
  }
  wk.cv.notify_one();
}

void Engine::WorkerLoop(int w) {
  Pin(pin_.workers, w, "worker");
  Worker& wk = *workers_[static_cast<size_t>(w)];
  ThreadExec exec(this);
  for (;;) {
    CallBase* c = nullptr;
    {
      std::unique_lock<std::mutex> lk(wk.mu);
      wk.cv.wait(lk, [&] { return !wk.q.empty() || wk.stop; });
      if (wk.q.empty()) return;  // stop and drained
      c = wk.q.front();
      wk.q.pop_front();
    }
    c->Run(exec);
  }
}

void Engine::ResponderLoop(int r) {
  Pin(pin_.responders, r, "responder");
  Responder& rs = *responders_[static_cast<size_t>(r)];
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    const bool poll = wait_mode() == WaitMode::kPoll &&
                      r < n_responders_.load(std::memory_order_relaxed) &&
                      !shutting_down_.load(std::memory_order_relaxed);
    if (poll) {
      auto st = rs.cq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (st == grpc::CompletionQueue::SHUTDOWN) break;
      if (st == grpc::CompletionQueue::TIMEOUT) {
        sched_yield();
        continue;
      }
    } else if (!rs.cq.Next(&tag, &ok)) {
      break;
    }
    Tag* t = static_cast<Tag*>(tag);
    t->call->OnLeafDone(t->slot, ok);
  }
}

grpc::CompletionQueue* Engine::PickResponder(CallBase* call, int) {
  const int n = n_responders_.load(std::memory_order_acquire);
  // No response threads: the replies come back to the poller that took the request, which
  // finalises too; no thread hand-off at all (the lowest-latency async set-up on few cores).
  if (n <= 0 || responders_.empty()) return pollers_[static_cast<size_t>(call->cq_index)]->cq.get();
  const uint32_t r = rr_responder_.fetch_add(1) % static_cast<uint32_t>(n);
  return &responders_[r]->cq;
}

void Engine::NoteFinish(CallBase* c, const grpc::Status& st) {
  if (c->counted) NoteItem(c->arrival_ns, st.ok());
}

void Engine::NoteItem(int64_t arrival_ns, bool ok) {
  hist_.Record(MonotonicNs() - arrival_ns);
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (!ok) errors_.fetch_add(1, std::memory_order_relaxed);
}

Engine::Snapshot Engine::TakeStats(bool reset) {
  std::lock_guard<std::mutex> lk(stats_mu_);
  const int64_t now = MonotonicNs();
  Snapshot s{requests_.load(), errors_.load(), leaf_errors_.load(),
             static_cast<double>(now - window_start_ns_.load()) / 1e9, hist_};
  if (reset) {
    hist_.Reset();
    requests_ = 0;
    errors_ = 0;
    leaf_errors_ = 0;
    window_start_ns_ = now;
  }
  return s;
}

int Engine::thread_count() const {
  return static_cast<int>(pollers_.size() + workers_.size() + responders_.size()) + 1;
}

// ------------------------------------------------------------------------------------------
// Threading control

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

// ------------------------------------------------------------------------------------------
// Hooks used by the call templates

LeafCallMode CurrentLeafMode(Engine* e) { return e->leaf_mode(); }
LeafTransport LeafTransportOf(Engine* e) { return e->opts().leaf_transport; }
int ResponderCount(Engine* e) { return e->responders_in_use(); }
void RegisterBatchHandler(Engine* e, uint64_t key, BatchHandler fn) {
  e->AddBatchHandler(key, std::move(fn));
}
grpc::CompletionQueue* PickResponderCq(Engine* e, CallBase* call, int n) { return e->PickResponder(call, n); }
void NoteLeafDone(Engine*, grpc::CompletionQueue*) {}
void NoteFinish(Engine* e, CallBase* call, const grpc::Status& status) { e->NoteFinish(call, status); }
void NoteLeafErrors(Engine* e, int n) { e->NoteLeafErrors(n); }

void WaitPrivate(Exec& exec, int n, const std::function<void(Tag*, bool)>& on_tag) {
  grpc::CompletionQueue* cq = exec.private_cq();
  int got = 0;
  while (got < n) {
    void* tag = nullptr;
    bool ok = false;
    if (exec.wait_mode() == WaitMode::kPoll) {
      auto st = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (st == grpc::CompletionQueue::SHUTDOWN) return;
      if (st == grpc::CompletionQueue::TIMEOUT) {
        sched_yield();
        continue;
      }
    } else if (!cq->Next(&tag, &ok)) {
      return;
    }
    ++got;
    on_tag(static_cast<Tag*>(tag), ok);
  }
}

// ------------------------------------------------------------------------------------------
// Admin service

namespace {

void FillThreading(Engine* e, ThreadingState* s) {
  const Threading t = e->Current();
  s->set_model(t.model.Name());
  s->set_pollers(t.pools.pollers);
  s->set_workers(t.pools.workers);
  s->set_responders(t.pools.responders);
  s->set_auto_mode(e->auto_mode());
  s->set_measured_qps(e->MeasuredQps());
  s->set_table(e->table_path());
  s->set_max_pollers(e->opts().max_pools.pollers);
  s->set_max_workers(e->opts().max_pools.workers);
  s->set_max_responders(e->opts().max_pools.responders);
  s->set_switches(e->switches());
  s->set_last_error(e->last_error());
  s->set_leaf_transport(e->opts().leaf_transport == LeafTransport::kBatch ? "batch" : "unary");
  const int64_t now = MonotonicNs();
  for (const auto& r : e->RecentSwitches()) {
    SwitchEvent* ev = s->add_recent_switches();
    ev->set_age_s(static_cast<double>(now - r.at_ns) / 1e9);
    ev->set_from(r.from);
    ev->set_to(r.to);
    ev->set_reason(r.reason);
    ev->set_measured_qps(r.qps);
    ev->set_backlog(r.backlog);
  }
}

class HealthH final : public LeafHandler<HealthRequest, HealthReply> {
 public:
  explicit HealthH(Engine* e) : e_(e) {}
  grpc::Status Handle(const HealthRequest&, HealthReply* r) override {
    r->set_serving(true);
    r->set_service(e_->opts().service);
    r->set_role(e_->role() == Role::kLeaf ? "leaf" : "midtier");
    r->set_uptime_s(e_->UptimeS());
    return grpc::Status::OK;
  }
  Engine* e_;
};

class StatsH final : public LeafHandler<StatsRequest, StatsReply> {
 public:
  explicit StatsH(Engine* e) : e_(e) {}
  grpc::Status Handle(const StatsRequest& q, StatsReply* r) override {
    Engine::Snapshot s = e_->TakeStats(q.reset());
    r->set_requests(s.requests);
    r->set_errors(s.errors);
    r->set_leaf_errors(s.leaf_errors);
    r->set_qps_now(e_->MeasuredQps());
    r->set_window_s(s.window_s);
    r->set_qps_avg(s.window_s > 0 ? static_cast<double>(s.requests) / s.window_s : 0);
    auto* l = r->mutable_latency();
    l->set_p50_us(static_cast<double>(s.hist.Percentile(0.50)) / 1e3);
    l->set_p90_us(static_cast<double>(s.hist.Percentile(0.90)) / 1e3);
    l->set_p99_us(static_cast<double>(s.hist.Percentile(0.99)) / 1e3);
    l->set_p999_us(static_cast<double>(s.hist.Percentile(0.999)) / 1e3);
    l->set_max_us(static_cast<double>(s.hist.Max()) / 1e3);
    l->set_mean_us(s.hist.Mean() / 1e3);
    for (auto& [ub, c] : s.hist.Buckets()) {
      auto* b = r->add_buckets();
      b->set_upper_ns(ub);
      b->set_count(c);
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    r->set_cpu_user_s(static_cast<double>(ru.ru_utime.tv_sec) + ru.ru_utime.tv_usec / 1e6);
    r->set_cpu_sys_s(static_cast<double>(ru.ru_stime.tv_sec) + ru.ru_stime.tv_usec / 1e6);
    r->set_uptime_s(e_->UptimeS());
    r->set_threads(static_cast<uint32_t>(e_->thread_count()));
    FillThreading(e_, r->mutable_threading());
    return grpc::Status::OK;
  }
  Engine* e_;
};

class GetThreadingH final : public LeafHandler<GetThreadingRequest, ThreadingState> {
 public:
  explicit GetThreadingH(Engine* e) : e_(e) {}
  grpc::Status Handle(const GetThreadingRequest&, ThreadingState* r) override {
    FillThreading(e_, r);
    return grpc::Status::OK;
  }
  Engine* e_;
};

class SetThreadingH final : public LeafHandler<SetThreadingRequest, ThreadingState> {
 public:
  explicit SetThreadingH(Engine* e) : e_(e) {}
  grpc::Status Handle(const SetThreadingRequest& q, ThreadingState* r) override {
    if (q.model() == "auto") {
      if (q.has_pollers() || q.has_workers() || q.has_responders())
        return {grpc::StatusCode::INVALID_ARGUMENT, "auto takes no pool sizes (the table sets them)"};
      if (std::string why = e_->SetAuto(q.table_path()); !why.empty())
        return {grpc::StatusCode::FAILED_PRECONDITION, why};
      FillThreading(e_, r);
      return grpc::Status::OK;
    }
    Threading t = e_->Current();
    if (!q.model().empty()) {
      auto m = ThreadingModel::Parse(q.model());
      if (!m) return {grpc::StatusCode::INVALID_ARGUMENT, "unknown threading model '" + q.model() + "'"};
      t.model = *m;
    }
    if (q.has_pollers()) t.pools.pollers = q.pollers();
    if (q.has_workers()) t.pools.workers = q.workers();
    else if (t.model.dispatch == DispatchMode::kDispatch && t.pools.workers < 1) t.pools.workers = 1;
    if (q.has_responders()) t.pools.responders = q.responders();
    else if (t.model.leaf == LeafCallMode::kAsync && !q.model().empty() &&
             e_->Current().model.leaf == LeafCallMode::kSync && t.pools.responders < 1)
      t.pools.responders = 1;  // sync -> async without pool sizes: the usual 1 response thread
    if (std::string why = e_->SetThreading(t); !why.empty())
      return {grpc::StatusCode::INVALID_ARGUMENT, why};
    FillThreading(e_, r);
    return grpc::Status::OK;
  }
  Engine* e_;
};

}  // namespace
}  // namespace musku::detail

// ------------------------------------------------------------------------------------------
// musku::Server

namespace musku {

struct Server::AdminParts {
  Admin::AsyncService service;
  std::unique_ptr<detail::HealthH> health;
  std::unique_ptr<detail::StatsH> stats;
  std::unique_ptr<detail::GetThreadingH> get;
  std::unique_ptr<detail::SetThreadingH> set;
};

namespace {
template <class Svc, class Fn, class Req, class Resp>
void AddAdmin(detail::Engine* e, Svc* svc, Fn fn, LeafHandler<Req, Resp>* h) {
  e->AddFactory(
      [svc, fn, h] {
        return std::unique_ptr<detail::CallBase>(new detail::UnaryCall<Svc, Fn, Req, Resp>(svc, fn, h));
      },
      /*admin=*/true, /*per_cq=*/2);
}
}  // namespace

Server::Server(ServerOptions opts, Role role)
    : engine_(std::make_unique<detail::Engine>(std::move(opts), role)) {
  admin_ = std::make_unique<AdminParts>();
  AdminParts* parts = admin_.get();
  detail::Engine* e = engine_.get();
  parts->health = std::make_unique<detail::HealthH>(e);
  parts->stats = std::make_unique<detail::StatsH>(e);
  parts->get = std::make_unique<detail::GetThreadingH>(e);
  parts->set = std::make_unique<detail::SetThreadingH>(e);
  e->RegisterService(&parts->service);
  AddAdmin(e, &parts->service, &Admin::AsyncService::RequestHealth, parts->health.get());
  AddAdmin(e, &parts->service, &Admin::AsyncService::RequestStats, parts->stats.get());
  AddAdmin(e, &parts->service, &Admin::AsyncService::RequestGetThreading, parts->get.get());
  AddAdmin(e, &parts->service, &Admin::AsyncService::RequestSetThreading, parts->set.get());
}

Server::~Server() {
  engine_->Shutdown();
  engine_.reset();  // threads joined, contexts freed: now the admin handlers may go
  admin_.reset();
}

void Server::RegisterService(grpc::Service* svc) { engine_->RegisterService(svc); }
void Server::RegisterBatchHandler(uint64_t key, detail::BatchHandler fn) {
  engine_->AddBatchHandler(key, std::move(fn));
}

void Server::AddCallFactory(std::function<std::unique_ptr<detail::CallBase>()> factory) {
  engine_->AddFactory(std::move(factory), false, engine_->opts().contexts_per_cq);
}

bool Server::Start(std::string* error) { return engine_->Start(error); }
void Server::Wait() { engine_->Wait(); }
void Server::Shutdown() { engine_->Shutdown(); }

int Server::Run() {
  std::string err;
  if (!Start(&err)) {
    LogError("%s: %s", engine_->opts().service.c_str(), err.c_str());
    return 1;
  }
  Wait();
  Shutdown();
  LogInfo("%s: stopped", engine_->opts().service.c_str());
  return 0;
}

int Server::port() const { return engine_->port(); }
const ServerOptions& Server::options() const { return engine_->opts(); }
std::string Server::SetThreading(const Threading& t) { return engine_->SetThreading(t); }
std::string Server::SetAuto(const std::string& p) { return engine_->SetAuto(p); }
Threading Server::CurrentThreading() const { return engine_->Current(); }
double Server::MeasuredQps() const { return engine_->MeasuredQps(); }
void Server::SetWorkerChooser(std::function<int(int)> fn) { engine_->SetWorkerChooser(std::move(fn)); }

void Server::BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace musku
