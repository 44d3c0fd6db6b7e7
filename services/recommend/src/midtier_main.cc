// recommend_midtier: asks every Recommend leaf and averages their predictions; on the musku
// threading framework.
//
//   recommend_midtier --leaves h:p,h:p,... [framework flags: --listen, --port-file, --threading,
//                     --leaf-timeout-ms ...]
#include <cstdio>

#include "midtier.h"
#include "musku/framework.h"

int main(int argc, char** argv) {
  using namespace musku::recommend;
  musku::Server::BlockTerminationSignals();
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "recommend", &opts, &err)) {
    std::fprintf(stderr, "recommend_midtier: %s\n%s", err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  if (opts.leaves.empty()) {
    std::fprintf(stderr, "recommend_midtier: --leaves H:P[,H:P...] is required\n");
    return 2;
  }
  try {
    PredictHandler handler;
    musku::LeafSet<RecommendLeaf> leaves(opts.leaves, opts.leaf_timeout_ms);
    Recommend::AsyncService service;
    musku::Server server(opts, musku::Role::kMidTier);
    server.AddMidTierMethod(&service, &Recommend::AsyncService::RequestPredict, &handler, &leaves,
                            &RecommendLeaf::Stub::PrepareAsyncPredict);
    return server.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recommend_midtier: %s\n", e.what());
    return 1;
  }
}
