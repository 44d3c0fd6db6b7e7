// The engine's life cycle (bind, start the pools, orderly shutdown), its per-RPC contexts (armed
// on the pollers' queues, recycled), streams in flight, and the request statistics. The threads
// themselves are in threads.cc, threading control in control.cc.
#include "engine.h"

#include <pthread.h>
#include <signal.h>

#include <absl/synchronization/mutex.h>
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "engine_threads.h"
#include "musku/log.h"

namespace musku::detail {


Engine::Engine(ServerOptions opts, Role role)
    : opts_(std::move(opts)), role_(role), start_ns_(MonotonicNs()) {
  window_start_ns_ = start_ns_;
}

Engine::~Engine() { Shutdown(); }

void Engine::AddFactory(std::function<std::unique_ptr<CallBase>()> f, bool admin, int per_cq) {
  factories_.push_back(Factory{std::move(f), admin, per_cq});
  free_calls_.emplace_back();
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

void Engine::StreamStarted(StreamCall* c) {
  {
    std::lock_guard<std::mutex> lk(streams_mu_);
    streams_.insert(c);
  }
  if (!shutting_down_.load()) ArmOn(c->cq_index, c->factory, 1);
}

void Engine::CloseStreams() {
  std::vector<StreamCall*> open;
  {
    std::lock_guard<std::mutex> lk(streams_mu_);
    open.assign(streams_.begin(), streams_.end());
  }
  for (StreamCall* c : open) c->Close();
}

void Engine::Retire(StreamCall* c) {
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
             static_cast<double>(now - window_start_ns_.load()) / 1e9, hist_, {}, {}};
  for (int p = 0; p < kPhases; ++p) {
    s.phase_hist[p] = phase_hist_[p];
    s.phase_cpu_ns[p] = phase_cpu_ns_[p].load();
  }
  if (reset) {
    hist_.Reset();
    for (int p = 0; p < kPhases; ++p) {
      phase_hist_[p].Reset();
      phase_cpu_ns_[p] = 0;
    }
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

}  // namespace musku::detail
