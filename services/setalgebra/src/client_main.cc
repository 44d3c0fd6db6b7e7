// setalgebra_client: sends queries to a mid-tier (or a leaf with --leaf) and prints one JSON line
// per query: {"line": N, "code": STATUS, "docs": [...]} or {"line": N, "code": C, "error": "..."}.
//   setalgebra_client --target H:P (--queries FILE | --query "t1 t2") [--leaf] [--timeout-ms N]
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <grpcpp/grpcpp.h>

#include "setalgebra.grpc.pb.h"

namespace {
std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o;
}
}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> f;
  bool leaf = false;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--leaf") {
      leaf = true;
      continue;
    }
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) {
      std::fprintf(stderr, "setalgebra_client: bad argument %s\n", k.c_str());
      return 2;
    }
    f[k.substr(2)] = argv[++i];
  }
  if (f["target"].empty() || (f["queries"].empty() && !f.count("query"))) {
    std::fprintf(stderr, "usage: setalgebra_client --target H:P (--queries FILE | --query \"t1 t2\") [--leaf]\n");
    return 2;
  }
  std::vector<std::string> lines;
  if (f.count("query")) {
    lines.push_back(f["query"]);
  } else {
    std::ifstream in(f["queries"]);
    if (!in) {
      std::fprintf(stderr, "setalgebra_client: cannot read %s\n", f["queries"].c_str());
      return 1;
    }
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  const int timeout_ms = f.count("timeout-ms") ? std::atoi(f["timeout-ms"].c_str()) : 5000;
  auto ch = grpc::CreateChannel(f["target"], grpc::InsecureChannelCredentials());
  auto mid = setalgebra::MidTier::NewStub(ch);
  auto lf = setalgebra::Leaf::NewStub(ch);
  for (size_t n = 0; n < lines.size(); ++n) {
    std::istringstream ss(lines[n]);
    std::vector<std::string> terms;
    for (std::string t; ss >> t;) terms.push_back(t);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    grpc::Status st;
    std::vector<uint32_t> docs;
    if (leaf) {
      setalgebra::LeafRequest q;
      for (auto& t : terms) q.add_terms(t);
      setalgebra::LeafReply r;
      st = lf->Intersect(&ctx, q, &r);
      docs.assign(r.docs().begin(), r.docs().end());
    } else {
      setalgebra::QueryRequest q;
      q.set_id(n);
      for (auto& t : terms) q.add_terms(t);
      setalgebra::QueryReply r;
      st = mid->Query(&ctx, q, &r);
      if (st.ok() && r.id() != n) {
        std::fprintf(stderr, "setalgebra_client: reply id %llu for query %zu\n",
                     static_cast<unsigned long long>(r.id()), n);
        return 1;
      }
      docs.assign(r.docs().begin(), r.docs().end());
    }
    std::string out = "{\"line\": " + std::to_string(n) + ", \"code\": " + std::to_string(st.error_code());
    if (st.ok()) {
      out += ", \"docs\": [";
      for (size_t i = 0; i < docs.size(); ++i) out += (i ? "," : "") + std::to_string(docs[i]);
      out += "]}";
    } else {
      out += ", \"error\": \"" + JsonEscape(st.error_message()) + "\"}";
    }
    std::puts(out.c_str());
  }
  return 0;
}
