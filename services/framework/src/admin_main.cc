// musku_admin: the Admin RPCs of any musku server, printed as JSON (used by the Python side).
//   musku_admin --target H:P health | stats [--reset] | get
//   musku_admin --target H:P set MODEL [--pollers N] [--workers N] [--responders N]
//   musku_admin --target H:P set auto [--table PATH]
//   musku_admin --target H:P wait-healthy [--timeout-ms N]
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "admin.grpc.pb.h"

namespace {
int Usage(const char* why) {
  std::fprintf(stderr,
               "musku_admin: %s\nusage: musku_admin --target H:P health|stats [--reset]|get|"
               "wait-healthy [--timeout-ms N]|set MODEL|auto [--pollers N] [--workers N] "
               "[--responders N] [--table PATH]\n",
               why);
  return 2;
}
int Print(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  std::puts(s.c_str());
  return 0;
}
int Fail(const grpc::Status& st) {
  std::fprintf(stderr, "musku_admin: %s (code %d)\n", st.error_message().c_str(), st.error_code());
  return st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                 st.error_code() == grpc::StatusCode::FAILED_PRECONDITION
             ? 3
             : 1;
}
bool Int(const std::string& s, int* out) {
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end) return false;
  *out = static_cast<int>(v);
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> f;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reset") {
      f["reset"] = "1";
    } else if (a.rfind("--", 0) == 0) {
      if (i + 1 >= argc) return Usage(("flag " + a + " needs a value").c_str());
      f[a.substr(2)] = argv[++i];
    } else {
      pos.push_back(a);
    }
  }
  if (f["target"].empty() || pos.empty()) return Usage("--target and a command are required");
  auto stub = musku::Admin::NewStub(grpc::CreateChannel(f["target"], grpc::InsecureChannelCredentials()));
  int timeout_ms = 5000;
  if (f.count("timeout-ms") && !Int(f["timeout-ms"], &timeout_ms)) return Usage("bad --timeout-ms");
  auto deadline = [&] { return std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms); };
  const std::string cmd = pos[0];
  if (cmd == "health" || cmd == "wait-healthy") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      if (cmd == "wait-healthy") ctx.set_wait_for_ready(true);
      musku::HealthReply r;
      auto st = stub->Health(&ctx, musku::HealthRequest(), &r);
      if (st.ok()) return Print(r);
      if (cmd == "health" || std::chrono::steady_clock::now() >= until) return Fail(st);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (cmd == "stats") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    musku::StatsRequest q;
    q.set_reset(f.count("reset") > 0);
    musku::StatsReply r;
    auto st = stub->Stats(&ctx, q, &r);
    return st.ok() ? Print(r) : Fail(st);
  }
  if (cmd == "get") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    musku::ThreadingState r;
    auto st = stub->GetThreading(&ctx, musku::GetThreadingRequest(), &r);
    return st.ok() ? Print(r) : Fail(st);
  }
  if (cmd == "set") {
    if (pos.size() != 2) return Usage("set takes MODEL or auto");
    musku::SetThreadingRequest q;
    q.set_model(pos[1]);
    int v = 0;
    for (const char* k : {"pollers", "workers", "responders"}) {
      if (!f.count(k)) continue;
      if (!Int(f[k], &v)) return Usage("pool sizes are integers");
      if (std::string(k) == "pollers") q.set_pollers(v);
      if (std::string(k) == "workers") q.set_workers(v);
      if (std::string(k) == "responders") q.set_responders(v);
    }
    if (f.count("table")) q.set_table_path(f["table"]);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    musku::ThreadingState r;
    auto st = stub->SetThreading(&ctx, q, &r);
    return st.ok() ? Print(r) : Fail(st);
  }
  return Usage(("unknown command " + cmd).c_str());
}
