// The HDSearch mid-tier's request logic on the musku threading framework:
// Process = LSH candidates grouped by shard -> one leaf call per shard holding candidates;
// Finalize = k-way merge of the leaves' top-k (partial answers flagged, all-failed = UNAVAILABLE).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "hdsearch.grpc.pb.h"
#include "lsh.h"
#include "musku/framework.h"

namespace musku::hdsearch {

struct HdSearchOptions {
  std::string data;                 // the vector file the leaves were started on
  std::vector<std::string> leaves;  // host:port, leaf i holds shard i of leaves.size()
  LshParams lsh;                    // bucket_width 0 = width_scale x median NN distance
  float width_scale = 4.0f;
  std::uint32_t max_k = 1000;
};

class SearchHandler final
    : public MidTierHandler<SearchRequest, SearchReply, LeafRequest, LeafReply> {
 public:
  // Loads `data` in chunks and builds the LSH tables. Throws DataError / std::invalid_argument.
  explicit SearchHandler(HdSearchOptions opts);

  // Asks every leaf for its shard range and dimension; throws std::runtime_error on a mismatch
  // or a leaf not answering within `wait`.
  void CheckLeaves(std::chrono::milliseconds wait) const;

  grpc::Status Process(const SearchRequest& req, FanOut<LeafRequest>* out) override;
  grpc::Status Finalize(const SearchRequest& req, std::vector<musku::LeafReply<LeafReply>>& replies,
                        SearchReply* resp) override;

  const LshIndex& index() const { return *index_; }
  std::uint32_t dim() const { return dim_; }

 private:
  HdSearchOptions opts_;
  std::uint32_t dim_ = 0;
  std::uint64_t rows_ = 0;
  std::vector<std::uint64_t> shard_begin_;  // size leaves + 1
  std::unique_ptr<LshIndex> index_;
};

}  // namespace musku::hdsearch
