// The engine's thread pools (private to the engine's files): what each thread owns.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine.h"

namespace musku::detail {

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

}  // namespace musku::detail
