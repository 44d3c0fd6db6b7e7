// Set Algebra request logic: the leaf (intersection) and the mid-tier (fan-out + union).
#pragma once

#include <string>
#include <vector>

#include "index.h"
#include "musku/framework.h"
#include "setalgebra.grpc.pb.h"

namespace setalgebra {

constexpr int kMaxTerms = 64;
constexpr size_t kMaxTermLength = 256;

// "" if the terms are acceptable, else why not (-> INVALID_ARGUMENT).
std::string ValidateTerms(const google::protobuf::RepeatedPtrField<std::string>& terms);

// Sorted, deduplicated union of sorted lists.
void UnionSorted(const std::vector<const google::protobuf::RepeatedField<uint32_t>*>& lists,
                 google::protobuf::RepeatedField<uint32_t>* out);

class LeafLogic final : public musku::LeafHandler<LeafRequest, LeafReply> {
 public:
  LeafLogic(const Index* index, int shard) : index_(index), shard_(shard) {}
  grpc::Status Handle(const LeafRequest& req, LeafReply* resp) override;

 private:
  const Index* index_;
  int shard_;
};

class MidLogic final : public musku::MidTierHandler<QueryRequest, QueryReply, LeafRequest, LeafReply> {
 public:
  explicit MidLogic(std::vector<std::string> leaf_addresses) : addrs_(std::move(leaf_addresses)) {}
  grpc::Status Process(const QueryRequest& req, musku::FanOut<LeafRequest>* out) override;
  grpc::Status Finalize(const QueryRequest& req, std::vector<musku::LeafReply<LeafReply>>& replies,
                        QueryReply* resp) override;

 private:
  std::vector<std::string> addrs_;
};

}  // namespace setalgebra
