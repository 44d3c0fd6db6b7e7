// recommend_leaf: holds shard i of S of a ratings file, factorises it at start (masked NMF,
// Armadillo) and predicts ratings by user-based collaborative filtering; on the musku framework.
//
//   recommend_leaf --data ratings.bin --shard 0 --shards 4 [--rank 16] [--iterations 100]
//                  [--neighbours 40] [--seed 1] [framework flags: --listen, --port-file ...]
#include <chrono>
#include <cstdio>

#include "musku/framework.h"
#include "ratings.h"
#include "recommend.grpc.pb.h"

namespace musku::recommend {
namespace {

class PredictLeaf final : public musku::LeafHandler<PredictRequest, PredictReply> {
 public:
  explicit PredictLeaf(const CfModel* model) : model_(model) {}
  grpc::Status Handle(const PredictRequest& req, PredictReply* reply) override {
    float rating = 0;
    std::uint32_t neighbours = 0;
    switch (model_->Predict(req.user(), req.item(), &rating, &neighbours)) {
      case CfModel::Result::kUnknownUser:
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown user " + std::to_string(req.user()) +
                                                             " (ids 0.." + std::to_string(model_->users() - 1) + ")");
      case CfModel::Result::kUnknownItem:
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown item " + std::to_string(req.item()) +
                                                             " (ids 0.." + std::to_string(model_->items() - 1) + ")");
      case CfModel::Result::kOk:
        break;
    }
    reply->set_rating(rating);
    reply->set_neighbours(neighbours);
    return grpc::Status::OK;
  }

 private:
  const CfModel* model_;
};

}  // namespace
}  // namespace musku::recommend

int main(int argc, char** argv) {
  using namespace musku::recommend;
  musku::Server::BlockTerminationSignals();
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "recommend_leaf", &opts, &err)) {
    std::fprintf(stderr, "recommend_leaf: %s\n%s", err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  const std::string data = opts.Get("data");
  const long shard = opts.GetInt("shard", 0, &err);
  const long shards = opts.GetInt("shards", 1, &err);
  CfOptions cf;
  cf.rank = static_cast<std::uint32_t>(opts.GetInt("rank", cf.rank, &err));
  cf.iterations = static_cast<std::uint32_t>(opts.GetInt("iterations", cf.iterations, &err));
  cf.neighbours = static_cast<std::uint32_t>(opts.GetInt("neighbours", cf.neighbours, &err));
  cf.seed = static_cast<std::uint64_t>(opts.GetInt("seed", 1, &err));
  if (err.empty() && data.empty()) err = "--data PATH is required";
  if (err.empty() && (shards < 1 || shard < 0 || shard >= shards)) err = "need 0 <= --shard < --shards";
  if (!err.empty()) {
    std::fprintf(stderr, "recommend_leaf: %s\n", err.c_str());
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const RatingSet rs = ReadRatings(data, static_cast<std::uint32_t>(shard), static_cast<std::uint32_t>(shards));
    const CfModel model(rs, cf);
    std::fprintf(stderr, "recommend_leaf: shard %ld/%ld: %zu ratings, NMF rank %u train RMSE %.4f in %.2fs\n",
                 shard, shards, rs.ratings.size(), cf.rank, model.TrainRmse(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    PredictLeaf predict(&model);
    RecommendLeaf::AsyncService service;
    musku::Server server(opts, musku::Role::kLeaf);
    server.AddLeafMethod(&service, &RecommendLeaf::AsyncService::RequestPredict, &predict);
    return server.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recommend_leaf: %s\n", e.what());
    return 1;
  }
}
