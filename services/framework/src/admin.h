// The Admin service (services/common/proto/admin.proto) every musku server runs: Health,
// Stats, GetThreading and SetThreading, answered inline on the pollers from the engine's state.
#pragma once

#include <memory>

#include "engine.h"

namespace musku::detail {

class AdminService {
 public:
  // Registers the service and its handlers' call factories with `engine` (before Start).
  explicit AdminService(Engine* engine);
  ~AdminService();  // after the engine: its contexts point at the handlers
  AdminService(const AdminService&) = delete;
  AdminService& operator=(const AdminService&) = delete;

 private:
  struct Parts;
  std::unique_ptr<Parts> parts_;
};

}  // namespace musku::detail
