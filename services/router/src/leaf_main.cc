// router_leaf: a RouterLeaf in front of one real memcached server, through libmemcached, on the
// musku threading framework.
//
//   router_leaf --memcached 127.0.0.1:11211 [--memcached-timeout-ms 1000]
//               [framework flags: --listen, --port-file, --threading ...]
//
// memcached gets what is left of the leaf call's deadline (the mid-tier's --leaf-timeout-ms),
// at most --memcached-timeout-ms. A fixed 50 ms timed out on a busy host, where a memcached
// thread (or this leaf's) can wait tens of ms for a CPU: a set then missed its quorum while the
// caller would have waited 10x longer. A dead memcached still fails at once (refused connect).
#include <grpcpp/grpcpp.h>
#include <libmemcached/memcached.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "musku/framework.h"
#include "placement.h"
#include "router.grpc.pb.h"

namespace musku::router {
namespace {

// A pool of libmemcached handles (a memcached_st is not thread-safe): one per concurrent RPC.
class MemcachedPool {
 public:
  MemcachedPool(const std::string& host, int port, int timeout_ms) : timeout_ms_(timeout_ms) {
    base_ = memcached_create(nullptr);
    if (base_ == nullptr) throw std::runtime_error("memcached_create failed");
    memcached_return_t rc = memcached_server_add(base_, host.c_str(), static_cast<in_port_t>(port));
    if (rc != MEMCACHED_SUCCESS) {
      throw std::runtime_error("memcached_server_add " + host + ": " + memcached_strerror(base_, rc));
    }
    memcached_behavior_set(base_, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
    memcached_behavior_set(base_, MEMCACHED_BEHAVIOR_NO_BLOCK, 1);
    memcached_behavior_set(base_, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, static_cast<uint64_t>(timeout_ms));
    memcached_behavior_set(base_, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, static_cast<uint64_t>(timeout_ms));
    // After a failure, try the server again on the next request (no long dead-server window):
    // the mid-tier owns failover, the leaf just reports UNAVAILABLE.
    memcached_behavior_set(base_, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 1);
  }
  ~MemcachedPool() {
    for (memcached_st* m : free_) memcached_free(m);
    memcached_free(base_);
  }
  MemcachedPool(const MemcachedPool&) = delete;
  MemcachedPool& operator=(const MemcachedPool&) = delete;

  struct Lease {
    MemcachedPool* pool;
    memcached_st* m;
    ~Lease() { pool->Release(m); }
  };
  // A handle whose connect and poll timeouts are this call's time left (see the top).
  Lease Acquire() {
    memcached_st* m = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        m = free_.back();
        free_.pop_back();
      }
    }
    if (m == nullptr) m = memcached_clone(nullptr, base_);
    if (m == nullptr) throw std::runtime_error("memcached_clone failed");
    const auto budget = static_cast<uint64_t>(BudgetMs());
    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, budget);
    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, budget);
    return Lease{this, m};
  }

 private:
  void Release(memcached_st* m) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(m);
  }
  // Milliseconds left before the caller's deadline, in [1, --memcached-timeout-ms].
  int BudgetMs() const {
    const auto deadline = musku::CallDeadline();
    if (deadline == std::chrono::system_clock::time_point::max()) return timeout_ms_;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::system_clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 1, timeout_ms_));
  }

  int timeout_ms_;
  memcached_st* base_ = nullptr;
  std::mutex mu_;
  std::vector<memcached_st*> free_;
};

grpc::Status StoreError(memcached_st* m, memcached_return_t rc) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string("memcached: ") + memcached_strerror(m, rc));
}

class GetLeaf final : public musku::LeafHandler<GetRequest, GetReply> {
 public:
  explicit GetLeaf(MemcachedPool* pool) : pool_(pool) {}
  grpc::Status Handle(const GetRequest& req, GetReply* reply) override {
    if (std::string why = ValidateKey(req.key()); !why.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
    }
    auto lease = pool_->Acquire();
    size_t len = 0;
    uint32_t flags = 0;
    memcached_return_t rc = MEMCACHED_SUCCESS;
    char* value = memcached_get(lease.m, req.key().data(), req.key().size(), &len, &flags, &rc);
    std::unique_ptr<char, decltype(&std::free)> owned(value, &std::free);
    if (rc == MEMCACHED_NOTFOUND) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such key");
    if (rc != MEMCACHED_SUCCESS) return StoreError(lease.m, rc);
    reply->set_value(value == nullptr ? std::string() : std::string(value, len));
    reply->set_flags(flags);
    reply->set_attempts(1);
    return grpc::Status::OK;
  }

 private:
  MemcachedPool* pool_;
};

class SetLeaf final : public musku::LeafHandler<SetRequest, SetReply> {
 public:
  explicit SetLeaf(MemcachedPool* pool) : pool_(pool) {}
  grpc::Status Handle(const SetRequest& req, SetReply* reply) override {
    if (std::string why = ValidateKey(req.key()); !why.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
    }
    if (req.value().size() > kMaxValueBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "value larger than memcached's item limit");
    }
    auto lease = pool_->Acquire();
    memcached_return_t rc =
        memcached_set(lease.m, req.key().data(), req.key().size(), req.value().data(), req.value().size(),
                      static_cast<time_t>(req.ttl_seconds()), req.flags());
    if (rc != MEMCACHED_SUCCESS) return StoreError(lease.m, rc);
    reply->set_stored(1);
    reply->set_replicas(1);
    return grpc::Status::OK;
  }

 private:
  MemcachedPool* pool_;
};

}  // namespace
}  // namespace musku::router

int main(int argc, char** argv) {
  using namespace musku::router;
  musku::Server::BlockTerminationSignals();
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "router_leaf", &opts, &err)) {
    std::fprintf(stderr, "router_leaf: %s\n%s", err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  const std::string mc = opts.Get("memcached", "127.0.0.1:11211");
  const long timeout_ms = opts.GetInt("memcached-timeout-ms", 1000, &err);
  const auto colon = mc.rfind(':');
  const int mc_port = colon == std::string::npos ? 0 : std::atoi(mc.substr(colon + 1).c_str());
  if (err.empty() && (mc_port <= 0 || mc_port > 65535)) err = "--memcached wants HOST:PORT, got '" + mc + "'";
  if (err.empty() && (timeout_ms < 1 || timeout_ms > 600000))
    err = "--memcached-timeout-ms wants 1..600000, got " + std::to_string(timeout_ms);
  if (!err.empty()) {
    std::fprintf(stderr, "router_leaf: %s\n", err.c_str());
    return 2;
  }
  try {
    MemcachedPool pool(mc.substr(0, colon), mc_port, static_cast<int>(timeout_ms));
    GetLeaf get(&pool);
    SetLeaf set(&pool);
    RouterLeaf::AsyncService service;
    musku::Server server(opts, musku::Role::kLeaf);
    server.AddLeafMethod(&service, &RouterLeaf::AsyncService::RequestGet, &get);
    server.AddLeafMethod(&service, &RouterLeaf::AsyncService::RequestSet, &set);
    return server.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "router_leaf: %s\n", e.what());
    return 1;
  }
}
