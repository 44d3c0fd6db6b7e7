// The Router mid-tier's request logic on the musku threading framework.
//
// Set: Process fans the request out to every replica of the key; Finalize counts the replicas
//      that stored it and answers OK when at least `write_quorum` did.
// Get: Process sends it to ONE replica chosen at random; when that replica fails (leaf down or
//      slow, its memcached down) or misses, Finalize fails over to the remaining replicas in turn
//      (each call bounded by the leaf timeout: nothing waits forever). NOT_FOUND only when every
//      reachable replica misses; UNAVAILABLE when none answered.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "musku/framework.h"
#include "router.grpc.pb.h"

namespace musku::router {

struct RouterOptions {
  std::vector<std::string> leaves;  // host:port of each RouterLeaf (leaf index = position)
  std::uint32_t replicas = 3;       // replica pool size per key (capped by the leaf count)
  std::uint32_t write_quorum = 0;   // sets succeed when this many replicas stored it; 0 = majority
  std::chrono::milliseconds leaf_timeout{1000};
};

// Placement + failover shared by the two handlers. Thread-safe.
class RouterPolicy {
 public:
  explicit RouterPolicy(RouterOptions opts);  // throws std::invalid_argument
  std::vector<std::uint32_t> Replicas(const std::string& key) const;
  std::uint32_t write_quorum() const { return quorum_; }
  std::uint32_t num_leaves() const { return static_cast<std::uint32_t>(opts_.leaves.size()); }
  // Synchronous Get on one leaf (the failover path), deadline-bounded.
  grpc::Status GetFrom(std::uint32_t leaf, const GetRequest& req, GetReply* reply) const;

 private:
  RouterOptions opts_;
  std::uint32_t quorum_;
  std::vector<std::unique_ptr<RouterLeaf::Stub>> stubs_;
};

class GetHandler final : public MidTierHandler<GetRequest, GetReply, GetRequest, GetReply> {
 public:
  explicit GetHandler(const RouterPolicy* policy) : policy_(policy) {}
  grpc::Status Process(const GetRequest& req, FanOut<GetRequest>* out) override;
  grpc::Status Finalize(const GetRequest& req, std::vector<musku::LeafReply<GetReply>>& replies,
                        GetReply* resp) override;

 private:
  const RouterPolicy* policy_;
};

class SetHandler final : public MidTierHandler<SetRequest, SetReply, SetRequest, SetReply> {
 public:
  explicit SetHandler(const RouterPolicy* policy) : policy_(policy) {}
  grpc::Status Process(const SetRequest& req, FanOut<SetRequest>* out) override;
  grpc::Status Finalize(const SetRequest& req, std::vector<musku::LeafReply<SetReply>>& replies,
                        SetReply* resp) override;

 private:
  const RouterPolicy* policy_;
};

}  // namespace musku::router
