// musku_loadgen --target H:P (--service NAME --data FILE | --method /pkg.Svc/M --requests FILE)
//   [--mode open|closed] [--qps Q | --schedule QPS:S,QPS:S,...] [--duration S] [--warmup S]
//   [--concurrency N] [--channels N] [--cq-threads N] [--timeout-ms N] [--seed N] [--json PATH]
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include "loadgen.h"

namespace {
int Usage(const std::string& why) {
  std::fprintf(stderr,
               "musku_loadgen: %s\n"
               "usage: musku_loadgen --target H:P (--service NAME --data FILE | --method /pkg.Svc/M --requests FILE)\n"
               "  [--mode open|closed] [--qps Q | --schedule QPS:SEC,...] [--duration S] [--warmup S]\n"
               "  [--concurrency N] [--channels N] [--cq-threads N] [--timeout-ms N] [--seed N] [--json PATH]\n"
               "services with a built-in plug-in:",
               why.c_str());
  for (auto& [k, v] : loadgen::Plugins()) std::fprintf(stderr, " %s", k.c_str());
  std::fprintf(stderr, "\n");
  return 2;
}
bool Num(const std::map<std::string, std::string>& f, const char* k, double lo, double hi, double* out) {
  auto it = f.find(k);
  if (it == f.end()) return true;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || errno || *end || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  loadgen::RegisterBuiltinPlugins();
  std::map<std::string, std::string> f;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) return Usage("bad argument '" + k + "'");
    f[k.substr(2)] = argv[++i];
  }
  loadgen::Options o;
  o.target = f["target"];
  if (o.target.empty()) return Usage("--target is required");
  if (f.count("mode")) o.mode = f["mode"];
  if (o.mode != "open" && o.mode != "closed") return Usage("--mode is open or closed");
  double qps = 100, duration = 10, warmup = 1, conc = 16, channels = 1, cqt = 1, tmo = 5000, seed = 1;
  if (!Num(f, "qps", 1e-3, 1e7, &qps) || !Num(f, "duration", 0.01, 86400, &duration) ||
      !Num(f, "warmup", 0, 3600, &warmup) || !Num(f, "concurrency", 1, 100000, &conc) ||
      !Num(f, "channels", 1, 1024, &channels) || !Num(f, "cq-threads", 1, 64, &cqt) ||
      !Num(f, "timeout-ms", 1, 3.6e6, &tmo) || !Num(f, "seed", 0, 1e18, &seed))
    return Usage("a numeric flag is out of range or not a number");
  o.duration_s = duration;
  o.warmup_s = warmup;
  o.concurrency = static_cast<int>(conc);
  o.channels = static_cast<int>(channels);
  o.cq_threads = static_cast<int>(cqt);
  o.timeout_ms = static_cast<int>(tmo);
  o.seed = static_cast<uint64_t>(seed);
  if (f.count("schedule")) {
    if (std::string why = loadgen::ParseSchedule(f["schedule"], &o.phases); !why.empty()) return Usage(why);
  } else {
    o.phases = {{qps, duration}};
  }
  loadgen::Workload w;
  std::string why;
  if (f.count("service")) {
    auto it = loadgen::Plugins().find(f["service"]);
    if (it == loadgen::Plugins().end()) return Usage("no request plug-in for service '" + f["service"] + "'");
    if (f["data"].empty()) return Usage("--data FILE is required with --service");
    why = it->second(f["data"], &w);
  } else if (f.count("requests")) {
    if (f["method"].empty()) return Usage("--method /pkg.Service/Method is required with --requests");
    why = loadgen::LoadLengthPrefixed(f["requests"], f["method"], &w);
  } else {
    return Usage("--service NAME --data FILE or --method M --requests FILE is required");
  }
  if (!why.empty()) {
    std::fprintf(stderr, "musku_loadgen: %s\n", why.c_str());
    return 1;
  }
  loadgen::Result r;
  if (std::string err = loadgen::Run(o, w, &r); !err.empty()) {
    std::fprintf(stderr, "musku_loadgen: %s\n", err.c_str());
    return 1;
  }
  const std::string json = loadgen::ToJson(o, r);
  if (f.count("json")) {
    std::ofstream out(f["json"]);
    out << json << "\n";
    if (!out) {
      std::fprintf(stderr, "musku_loadgen: cannot write %s\n", f["json"].c_str());
      return 1;
    }
  }
  for (const auto& p : r.phases) {
    const auto& h = p.latency;
    std::printf("phase qps=%-8g achieved=%-9.1f ok=%-8llu err=%-6llu p50=%.3fms p90=%.3fms p99=%.3fms p99.9=%.3fms\n",
                p.phase.qps, p.window_s > 0 ? static_cast<double>(p.ok) / p.window_s : 0,
                static_cast<unsigned long long>(p.ok), static_cast<unsigned long long>(p.errors),
                static_cast<double>(h.Percentile(0.5)) / 1e6, static_cast<double>(h.Percentile(0.9)) / 1e6,
                static_cast<double>(h.Percentile(0.99)) / 1e6, static_cast<double>(h.Percentile(0.999)) / 1e6);
  }
  std::printf("%s\n", json.c_str());
  return 0;
}
