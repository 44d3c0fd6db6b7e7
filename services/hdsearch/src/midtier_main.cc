// hdsearch_midtier: LSH over the data set, fans candidates out to the leaves, merges the k
// nearest; on the musku threading framework.
//
//   hdsearch_midtier --data vectors.bin --leaves h:p,h:p [--tables 10] [--hashes 10]
//                    [--bucket-width 0 (auto)] [--width-scale 4] [--probes 16] [--seed 1]
//                    [framework flags: --listen, --port-file, --threading, --leaf-timeout-ms ...]
#include <cstdio>

#include "hdsearch_core.h"
#include "musku/framework.h"

int main(int argc, char** argv) {
  using namespace musku::hdsearch;
  musku::Server::BlockTerminationSignals();
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "hdsearch", &opts, &err)) {
    std::fprintf(stderr, "hdsearch_midtier: %s\n%s", err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  HdSearchOptions o;
  o.data = opts.Get("data");
  o.leaves = opts.leaves;
  o.lsh.tables = static_cast<std::uint32_t>(opts.GetInt("tables", o.lsh.tables, &err));
  o.lsh.hashes = static_cast<std::uint32_t>(opts.GetInt("hashes", o.lsh.hashes, &err));
  o.lsh.bucket_width = static_cast<float>(opts.GetDouble("bucket-width", 0.0, &err));
  o.width_scale = static_cast<float>(opts.GetDouble("width-scale", o.width_scale, &err));
  o.lsh.probes = static_cast<std::uint32_t>(opts.GetInt("probes", o.lsh.probes, &err));
  o.lsh.seed = static_cast<std::uint64_t>(opts.GetInt("seed", 1, &err));
  const long check_ms = opts.GetInt("leaf-check-timeout-ms", 30000, &err);
  if (err.empty() && o.data.empty()) err = "--data PATH is required";
  if (!err.empty()) {
    std::fprintf(stderr, "hdsearch_midtier: %s\n", err.c_str());
    return 2;
  }
  try {
    SearchHandler handler(o);
    handler.CheckLeaves(std::chrono::milliseconds(check_ms));
    std::fprintf(stderr, "hdsearch_midtier: %zu points, %zu buckets, w=%.3f\n", handler.index().num_points(),
                 handler.index().num_buckets(), static_cast<double>(handler.index().params().bucket_width));
    musku::LeafSet<HDSearchLeaf> leaves(opts.leaves, opts.leaf_timeout_ms);
    HDSearch::AsyncService service;
    musku::Server server(opts, musku::Role::kMidTier);
    server.AddMidTierMethod(&service, &HDSearch::AsyncService::RequestSearch, &handler, &leaves,
                            &HDSearchLeaf::Stub::PrepareAsyncDistances);
    return server.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hdsearch_midtier: %s\n", e.what());
    return 1;
  }
}
