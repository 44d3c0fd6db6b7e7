// hdsearch_leaf: holds shard i of S of a vector file; exact distances for candidate ids, on the
// musku threading framework.
//
//   hdsearch_leaf --data vectors.bin --shard 0 --shards 4
//                 [framework flags: --listen, --port-file, --threading ...]
#include <cstdio>
#include <memory>

#include "hdsearch.grpc.pb.h"
#include "musku/framework.h"
#include "shard.h"
#include "vectors.h"

namespace musku::hdsearch {
namespace {

class DistancesLeaf final : public musku::LeafHandler<LeafRequest, LeafReply> {
 public:
  explicit DistancesLeaf(const Shard* shard) : shard_(shard) {}
  grpc::Status Handle(const LeafRequest& req, LeafReply* reply) override {
    thread_local std::vector<std::uint32_t> ids;
    thread_local std::vector<float> dist;
    const std::string why = shard_->TopK(req.query().data(), static_cast<std::size_t>(req.query_size()),
                                         req.ids().data(), static_cast<std::size_t>(req.ids_size()), req.k(),
                                         &ids, &dist);
    if (!why.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
    reply->mutable_ids()->Add(ids.begin(), ids.end());
    reply->mutable_distances()->Add(dist.begin(), dist.end());
    reply->set_scored(static_cast<std::uint32_t>(req.ids_size()));
    return grpc::Status::OK;
  }

 private:
  const Shard* shard_;
};

class InfoLeaf final : public musku::LeafHandler<InfoRequest, InfoReply> {
 public:
  explicit InfoLeaf(const Shard* shard) : shard_(shard) {}
  grpc::Status Handle(const InfoRequest&, InfoReply* reply) override {
    reply->set_begin(shard_->begin());
    reply->set_end(shard_->end());
    reply->set_dim(shard_->dim());
    return grpc::Status::OK;
  }

 private:
  const Shard* shard_;
};

}  // namespace
}  // namespace musku::hdsearch

int main(int argc, char** argv) {
  using namespace musku::hdsearch;
  musku::Server::BlockTerminationSignals();
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "hdsearch_leaf", &opts, &err)) {
    std::fprintf(stderr, "hdsearch_leaf: %s\n%s", err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  const std::string data = opts.Get("data");
  const long shard = opts.GetInt("shard", 0, &err);
  const long shards = opts.GetInt("shards", 1, &err);
  if (err.empty() && data.empty()) err = "--data PATH is required";
  if (err.empty() && (shards < 1 || shard < 0 || shard >= shards)) err = "need 0 <= --shard < --shards";
  if (!err.empty()) {
    std::fprintf(stderr, "hdsearch_leaf: %s\n", err.c_str());
    return 2;
  }
  try {
    const VecHeader h = ReadVecHeader(data);
    if (h.rows < static_cast<std::uint64_t>(shards)) throw DataError(data + ": fewer rows than shards");
    const auto s = static_cast<std::uint32_t>(shard), n = static_cast<std::uint32_t>(shards);
    const std::uint64_t begin = ShardBegin(h.rows, s, n), end = ShardBegin(h.rows, s + 1, n);
    Shard store(ReadVecRows(data, h, begin, end), h.dim, begin);
    DistancesLeaf distances(&store);
    InfoLeaf info(&store);
    HDSearchLeaf::AsyncService service;
    musku::Server server(opts, musku::Role::kLeaf);
    server.AddLeafMethod(&service, &HDSearchLeaf::AsyncService::RequestDistances, &distances);
    server.AddLeafMethod(&service, &HDSearchLeaf::AsyncService::RequestInfo, &info);
    return server.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hdsearch_leaf: %s\n", e.what());
    return 1;
  }
}
