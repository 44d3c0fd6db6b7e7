// Set Algebra mid-tier: fans a query out to every shard's leaf and unions their results.
#include <cstdio>

#include "logic.h"

int main(int argc, char** argv) {
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "setalgebra", &opts, &err)) {
    std::fprintf(stderr, "setalgebra_midtier: %s\nusage: setalgebra_midtier --leaves H:P,H:P [framework flags]\n%s",
                 err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  if (opts.leaves.empty()) {
    std::fprintf(stderr, "setalgebra_midtier: --leaves HOST:PORT[,HOST:PORT...] is required\n");
    return 2;
  }
  musku::LeafSet<setalgebra::Leaf> leaves(opts.leaves, opts.leaf_timeout_ms);
  setalgebra::MidTier::AsyncService service;
  setalgebra::MidLogic logic(opts.leaves);
  musku::Server server(opts, musku::Role::kMidTier);
  server.AddMidTierMethod(&service, &setalgebra::MidTier::AsyncService::RequestQuery, &logic, &leaves,
                          &setalgebra::Leaf::Stub::PrepareAsyncIntersect);
  return server.Run();
}
