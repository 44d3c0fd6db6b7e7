// router_midtier: routes memcached get/set to RouterLeaf replicas by SpookyHash V2, on the
// musku threading framework (any of the eight models; see services/framework/README.md).
//
//   router_midtier --leaves h:p,h:p,... [--replicas 3] [--write-quorum 0 (majority)]
//                  [framework flags: --listen, --port-file, --threading, --leaf-timeout-ms ...]
#include <cstdio>

#include "musku/framework.h"
#include "router_core.h"

int main(int argc, char** argv) {
  using namespace musku::router;
  musku::Server::BlockTerminationSignals();
  musku::ServerOptions opts;
  std::string err;
  if (!musku::ParseServerOptions(argc, argv, "router", &opts, &err)) {
    std::fprintf(stderr, "router_midtier: %s\n%s", err.c_str(), musku::ServerOptionsUsage().c_str());
    return 2;
  }
  RouterOptions ro;
  ro.leaves = opts.leaves;
  ro.replicas = static_cast<std::uint32_t>(opts.GetInt("replicas", 3, &err));
  ro.write_quorum = static_cast<std::uint32_t>(opts.GetInt("write-quorum", 0, &err));
  ro.leaf_timeout = std::chrono::milliseconds(opts.leaf_timeout_ms);
  if (!err.empty()) {
    std::fprintf(stderr, "router_midtier: %s\n", err.c_str());
    return 2;
  }
  try {
    RouterPolicy policy(ro);
    GetHandler get(&policy);
    SetHandler set(&policy);
    musku::LeafSet<RouterLeaf> leaves(opts.leaves, opts.leaf_timeout_ms);
    Router::AsyncService service;
    musku::Server server(opts, musku::Role::kMidTier);
    server.AddMidTierMethod(&service, &Router::AsyncService::RequestGet, &get, &leaves,
                            &RouterLeaf::Stub::PrepareAsyncGet);
    server.AddMidTierMethod(&service, &Router::AsyncService::RequestSet, &set, &leaves,
                            &RouterLeaf::Stub::PrepareAsyncSet);
    return server.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "router_midtier: %s\n", e.what());
    return 2;
  }
}
