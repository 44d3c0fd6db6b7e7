// Threading models and pool sizes: names, parsing, validation (the vocabulary of the decision
// table and of threading control).
#include <sstream>

#include "musku/framework.h"

namespace musku {

std::string ThreadingModel::Name() const {
  std::string s = leaf == LeafCallMode::kSync ? "sync" : "async";
  s += dispatch == DispatchMode::kInline ? "-inline" : "-dispatch";
  s += wait == WaitMode::kBlock ? "-block" : "-poll";
  return s;
}

std::optional<ThreadingModel> ThreadingModel::Parse(std::string_view name) {
  for (const auto& m : All())
    if (m.Name() == name) return m;
  return std::nullopt;
}

std::vector<ThreadingModel> ThreadingModel::All() {
  std::vector<ThreadingModel> all;
  for (auto l : {LeafCallMode::kSync, LeafCallMode::kAsync})
    for (auto d : {DispatchMode::kInline, DispatchMode::kDispatch})
      for (auto w : {WaitMode::kBlock, WaitMode::kPoll}) all.push_back(ThreadingModel{l, d, w});
  return all;
}

std::string Threading::ToString() const {
  std::ostringstream os;
  os << model.Name() << " p=" << pools.pollers << " w=" << pools.workers << " r=" << pools.responders;
  return os.str();
}

std::string ValidateThreading(const Threading& t, const PoolSizes& max) {
  const auto& p = t.pools;
  std::ostringstream os;
  if (p.pollers < 1 || p.pollers > max.pollers)
    os << "pollers must be in [1, " << max.pollers << "], got " << p.pollers;
  else if (p.workers < 0 || p.workers > max.workers)
    os << "workers must be in [0, " << max.workers << "], got " << p.workers;
  else if (p.responders < 0 || p.responders > max.responders)
    os << "responders must be in [0, " << max.responders << "], got " << p.responders;
  else if (t.model.dispatch == DispatchMode::kDispatch && p.workers < 1)
    os << "model " << t.model.Name() << " needs at least 1 worker";
  return os.str();
}

}  // namespace musku
