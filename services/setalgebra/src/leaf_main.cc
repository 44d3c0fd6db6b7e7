// Set Algebra leaf: holds one document shard of the inverted index and intersects posting lists.
#include <cstdio>

#include "index.h"
#include "logic.h"

int main(int argc, char** argv) {
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "setalgebra-leaf", &opts, &err)) {
    std::fprintf(stderr, "setalgebra_leaf: %s\nusage: setalgebra_leaf --index PATH --shard I --shards N [framework flags]\n%s",
                 err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  const std::string path = opts.Get("index");
  const long shard = opts.GetInt("shard", 0, &err);
  const long shards = opts.GetInt("shards", 1, &err);
  if (path.empty() || !err.empty()) {
    std::fprintf(stderr, "setalgebra_leaf: %s\n", err.empty() ? "--index PATH is required" : err.c_str());
    return 2;
  }
  setalgebra::Index index;
  if (std::string why = index.Load(path, static_cast<int>(shard), static_cast<int>(shards)); !why.empty()) {
    std::fprintf(stderr, "setalgebra_leaf: %s\n", why.c_str());
    return 1;
  }
  std::fprintf(stderr, "setalgebra_leaf: shard %ld/%ld: %zu terms, %llu postings\n", shard, shards,
               index.num_terms(), static_cast<unsigned long long>(index.num_postings()));
  setalgebra::Leaf::AsyncService service;
  setalgebra::LeafLogic logic(&index, static_cast<int>(shard));
  musku::Server server(opts, musku::Role::kLeaf);
  server.AddLeafMethod(&service, &setalgebra::Leaf::AsyncService::RequestIntersect, &logic);
  return server.Run();
}
