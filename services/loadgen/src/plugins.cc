// Built-in request plug-ins: turn a service's data file into serialized requests.
#include <fstream>
#include <sstream>

#include "loadgen.h"
#include "setalgebra/setalgebra.pb.h"

namespace loadgen {
namespace {

grpc::ByteBuffer Serialize(const google::protobuf::Message& m) {
  std::string s;
  m.SerializeToString(&s);
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// setalgebra: a queries file, one query per line, terms separated by spaces.
std::string SetAlgebra(const std::string& path, Workload* out) {
  std::ifstream in(path);
  if (!in) return "cannot read queries file " + path;
  out->method = "/setalgebra.MidTier/Query";
  out->requests.clear();
  std::string line;
  uint64_t n = 0;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    setalgebra::QueryRequest q;
    q.set_id(n++);
    for (std::string t; ss >> t;) q.add_terms(t);
    if (q.terms_size() == 0) continue;
    out->requests.push_back(Serialize(q));
  }
  if (out->requests.empty()) return path + " holds no queries";
  return "";
}

}  // namespace

void RegisterBuiltinPlugins() { Plugins()["setalgebra"] = SetAlgebra; }

}  // namespace loadgen
