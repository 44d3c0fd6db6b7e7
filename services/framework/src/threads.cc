// The engine's threads and queues: network pollers (server completion queues), workers
// (per-worker queues, condvar wake-ups), response threads (leaf-reply completion queues), their
// CPU placement, and the hand-off between them (inline, dispatch, responder choice).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <sstream>

#include "engine.h"
#include "engine_threads.h"
#include "musku/log.h"

namespace musku::detail {

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

void Engine::RunOrDispatch(CallBase* job, Exec& exec) {
  if (dispatch_mode_.load(std::memory_order_acquire) == static_cast<int>(DispatchMode::kInline))
    job->Run(exec);
  else
    Dispatch(job);
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

}  // namespace musku::detail
