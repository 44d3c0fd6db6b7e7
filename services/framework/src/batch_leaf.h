// The leaf end of the batch transport (--leaf-transport batch): musku.LeafBatch/Stream served
// next to a leaf's own methods, with the same handlers. Each message read is one job, run
// inline on the poller or on a worker as the leaf's model says; its replies join the stream's
// write queue. The mid-tier end is batch_transport.cc.
#pragma once

#include <grpcpp/impl/service_type.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine.h"

namespace musku::detail {

class BatchLeafService {
 public:
  explicit BatchLeafService(std::string service) : service_(std::move(service)) {}
  ~BatchLeafService();  // after the engine: its stream contexts point here
  BatchLeafService(const BatchLeafService&) = delete;
  BatchLeafService& operator=(const BatchLeafService&) = delete;

  // A leaf method, keyed by BatchMethodKey (the first of two with the same types wins).
  void AddHandler(uint64_t key, BatchHandler fn);
  const BatchHandler* Find(uint64_t key) const;
  // Registers musku.LeafBatch and its stream contexts with `engine`, if any handler was added
  // (once; before the engine starts).
  void Install(Engine* engine);

 private:
  std::string service_;
  std::map<uint64_t, BatchHandler> handlers_;
  std::unique_ptr<grpc::Service> service_impl_;  // musku::LeafBatch::AsyncService
};

}  // namespace musku::detail
