#include "hdsearch_core.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "vectors.h"

namespace musku::hdsearch {
namespace {

grpc::Status Invalid(const std::string& why) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why); }

}  // namespace

SearchHandler::SearchHandler(HdSearchOptions opts) : opts_(std::move(opts)) {
  if (opts_.leaves.empty()) throw std::invalid_argument("hdsearch: no leaves given (--leaves)");
  const VecHeader h = ReadVecHeader(opts_.data);
  dim_ = h.dim;
  rows_ = h.rows;
  const auto n_leaves = static_cast<std::uint32_t>(opts_.leaves.size());
  if (rows_ < n_leaves) throw std::invalid_argument("hdsearch: fewer points than leaves");
  for (std::uint32_t s = 0; s <= n_leaves; ++s) shard_begin_.push_back(ShardBegin(rows_, s, n_leaves));
  // Build in bounded chunks so a 500K x 2048 data set never sits in the mid-tier's memory.
  constexpr std::uint64_t kChunk = 32768;
  for (std::uint64_t b = 0; b < rows_; b += kChunk) {
    const std::uint64_t e = std::min(rows_, b + kChunk);
    std::vector<float> chunk = ReadVecRows(opts_.data, h, b, e);
    if (!index_) {
      LshParams p = opts_.lsh;
      if (p.bucket_width <= 0.0f) {
        p.bucket_width = EstimateBucketWidth(chunk.data(), e - b, dim_, p.seed, opts_.width_scale);
      }
      index_ = std::make_unique<LshIndex>(dim_, p);
    }
    index_->Add(chunk.data(), e - b, static_cast<std::uint32_t>(b));
  }
  index_->Finalize();
}

void SearchHandler::CheckLeaves(std::chrono::milliseconds wait) const {
  for (std::size_t s = 0; s < opts_.leaves.size(); ++s) {
    auto stub = HDSearchLeaf::NewStub(grpc::CreateChannel(opts_.leaves[s], grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + wait);
    ctx.set_wait_for_ready(true);
    InfoRequest req;
    InfoReply reply;
    grpc::Status st = stub->Info(&ctx, req, &reply);
    if (!st.ok()) throw std::runtime_error("leaf " + opts_.leaves[s] + " not answering: " + st.error_message());
    if (reply.begin() != shard_begin_[s] || reply.end() != shard_begin_[s + 1] || reply.dim() != dim_) {
      throw std::runtime_error("leaf " + opts_.leaves[s] + " holds rows [" + std::to_string(reply.begin()) + ", " +
                               std::to_string(reply.end()) + ") dim " + std::to_string(reply.dim()) +
                               ", expected shard " + std::to_string(s) + " = [" + std::to_string(shard_begin_[s]) +
                               ", " + std::to_string(shard_begin_[s + 1]) + ") dim " + std::to_string(dim_) +
                               " (same --data and leaf order?)");
    }
  }
}

grpc::Status SearchHandler::Process(const SearchRequest& req, FanOut<LeafRequest>* out) {
  if (static_cast<std::uint32_t>(req.query_size()) != dim_) {
    return Invalid("query has " + std::to_string(req.query_size()) + " dimensions, the data " +
                   std::to_string(dim_));
  }
  if (req.k() == 0 || req.k() > opts_.max_k) return Invalid("k must be 1.." + std::to_string(opts_.max_k));
  for (float x : req.query()) {
    if (!std::isfinite(x)) return Invalid("query has NaN/Inf");
  }
  thread_local LshScratch scratch;
  thread_local std::vector<std::uint32_t> cand;
  cand.clear();
  index_->Query(req.query().data(), &scratch, &cand);  // ascending: grouped by shard (contiguous id ranges)
  std::size_t i = 0;
  while (i < cand.size()) {
    const auto leaf = static_cast<int>(
        std::upper_bound(shard_begin_.begin(), shard_begin_.end(), cand[i]) - shard_begin_.begin() - 1);
    LeafRequest* lr = out->To(leaf);
    *lr->mutable_query() = req.query();
    lr->set_k(req.k());
    const std::uint64_t end = shard_begin_[static_cast<std::size_t>(leaf) + 1];
    std::size_t j = i;
    while (j < cand.size() && cand[j] < end) ++j;
    lr->mutable_ids()->Add(cand.begin() + static_cast<long>(i), cand.begin() + static_cast<long>(j));
    i = j;
  }
  return grpc::Status::OK;
}

grpc::Status SearchHandler::Finalize(const SearchRequest& req, std::vector<musku::LeafReply<LeafReply>>& replies,
                                     SearchReply* resp) {
  std::vector<std::pair<float, std::uint32_t>> merged;
  std::uint32_t failed = 0, candidates = 0;
  std::string last_error;
  for (auto& r : replies) {
    if (!r.status.ok() || r.reply.ids_size() != r.reply.distances_size()) {
      ++failed;
      last_error = "leaf " + std::to_string(r.leaf) + ": " +
                   (r.status.ok() ? std::string("malformed reply") : r.status.error_message());
      continue;
    }
    candidates += r.reply.scored();
    for (int j = 0; j < r.reply.ids_size(); ++j) merged.emplace_back(r.reply.distances(j), r.reply.ids(j));
  }
  resp->set_candidates(candidates);
  resp->set_leaves_queried(static_cast<std::uint32_t>(replies.size()));
  resp->set_leaves_failed(failed);
  if (!replies.empty() && failed == replies.size()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "every leaf failed (" + last_error + ")");
  }
  const std::size_t k = std::min<std::size_t>(req.k(), merged.size());
  std::partial_sort(merged.begin(), merged.begin() + static_cast<long>(k), merged.end());
  for (std::size_t j = 0; j < k; ++j) {
    resp->add_ids(merged[j].second);
    resp->add_distances(std::sqrt(merged[j].first));
  }
  return grpc::Status::OK;
}

}  // namespace musku::hdsearch
