// The command line shared by every server (the threading model names are in threading.cc).
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "musku/framework.h"

namespace musku {

namespace {
// gRPC reads GRPC_POLL_STRATEGY once, at its first initialisation; this runs before main().
// The servers default to "poll": on loopback fan-out it measured lower latency than epoll1's
// single designated poller with cross-thread kicks (Set Algebra at 1000 QPS, 8 alternating
// pairs: p50 0.49-0.80 vs 0.75-1.10 ms, p99 1.3-2.1 vs 2.2-3.2 ms; saturation alike). poll()
// scans every fd per call: a mid-tier with thousands of client connections should set
// GRPC_POLL_STRATEGY=epoll1, which this default never overrides.
const bool kPollStrategyDefault = [] {
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  return true;
}();
}  // namespace

namespace {
bool ParseInt(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace

std::string ServerOptions::UnreadFlags() const {
  std::string out;
  for (const auto& [k, v] : extra)
    if (!read_.count(k)) out += (out.empty() ? "--" : ", --") + k;
  return out;
}

std::string ServerOptions::Get(const std::string& key, const std::string& def) const {
  read_.insert(key);
  auto it = extra.find(key);
  return it == extra.end() ? def : it->second;
}

long ServerOptions::GetInt(const std::string& key, long def, std::string* error) const {
  read_.insert(key);
  auto it = extra.find(key);
  if (it == extra.end()) return def;
  long v = 0;
  if (!ParseInt(it->second, std::numeric_limits<long>::min(), std::numeric_limits<long>::max(), &v)) {
    if (error) *error = "--" + key + " takes an integer, not '" + it->second + "'";
    return def;
  }
  return v;
}

double ServerOptions::GetDouble(const std::string& key, double def, std::string* error) const {
  read_.insert(key);
  auto it = extra.find(key);
  if (it == extra.end()) return def;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (errno || it->second.empty() || *end != '\0') {
    if (error) *error = "--" + key + " takes a number, not '" + it->second + "'";
    return def;
  }
  return v;
}

bool ParseServerOptions(int argc, char** argv, const std::string& service, ServerOptions* o,
                        std::string* error) {
  // Every main parses first: block SIGTERM/SIGINT before gRPC starts threads so that only the
  // server's sigwait() thread receives them.
  Server::BlockTerminationSignals();
  o->service = service;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() < 3) {
      o->positional.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    auto eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    } else {
      *error = "flag --" + key + " needs a value";
      return false;
    }
    kv[key] = value;
  }
  auto take_int = [&](const char* key, long lo, long hi, int* out) -> bool {
    auto it = kv.find(key);
    if (it == kv.end()) return true;
    long v = 0;
    if (!ParseInt(it->second, lo, hi, &v)) {
      *error = std::string("--") + key + " takes an integer in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "], not '" + it->second + "'";
      return false;
    }
    *out = static_cast<int>(v);
    kv.erase(it);
    return true;
  };
  int pollers = -1, workers = -1, responders = -1;
  if (!take_int("pollers", 1, 256, &pollers) || !take_int("workers", 0, 256, &workers) ||
      !take_int("responders", 0, 256, &responders) ||
      !take_int("max-pollers", 1, 256, &o->max_pools.pollers) ||
      !take_int("max-workers", 1, 256, &o->max_pools.workers) ||
      !take_int("max-responders", 1, 256, &o->max_pools.responders) ||
      !take_int("leaf-timeout-ms", 1, 3600000, &o->leaf_timeout_ms) ||
      !take_int("shutdown-grace-ms", 0, 3600000, &o->shutdown_grace_ms) ||
      !take_int("contexts-per-cq", 1, 100000, &o->contexts_per_cq) ||
      !take_int("auto-interval-ms", 1, 60000, &o->auto_interval_ms) ||
      !take_int("auto-persist-ms", 0, 60000, &o->auto_persist_ms))
    return false;
  auto take_str = [&](const char* key, std::string* out) {
    auto it = kv.find(key);
    if (it == kv.end()) return;
    *out = it->second;
    kv.erase(it);
  };
  std::string model = "sync-inline-block", leaves;
  take_str("threading", &model);
  take_str("threading-table", &o->threading_table);
  take_str("listen", &o->listen);
  take_str("port-file", &o->port_file);
  take_str("pin", &o->pin);
  take_str("leaves", &leaves);
  std::string transport = "unary";
  take_str("leaf-transport", &transport);
  if (transport == "unary") {
    o->leaf_transport = LeafTransport::kUnary;
  } else if (transport == "batch") {
    o->leaf_transport = LeafTransport::kBatch;
  } else {
    *error = "--leaf-transport takes unary or batch, not '" + transport + "'";
    return false;
  }
  if (model == "auto") {
    o->auto_threading = true;
    model = "sync-inline-block";  // until the table says otherwise / if the table is bad
    if (o->threading_table.empty()) {
      *error = "--threading auto needs --threading-table PATH (from `musku tune train`)";
      return false;
    }
  }
  auto m = ThreadingModel::Parse(model);
  if (!m) {
    std::string names;
    for (const auto& x : ThreadingModel::All()) names += " " + x.Name();
    *error = "unknown threading model '" + model + "'; one of: auto" + names;
    return false;
  }
  o->threading.model = *m;
  o->threading.pools.pollers = pollers > 0 ? pollers : 1;
  o->threading.pools.workers =
      workers >= 0 ? workers : (m->dispatch == DispatchMode::kDispatch ? 1 : 0);
  o->threading.pools.responders =
      responders >= 0 ? responders : (m->leaf == LeafCallMode::kAsync ? 1 : 0);
  // Maxima grow to hold what was asked for.
  o->max_pools.pollers = std::max(o->max_pools.pollers, o->threading.pools.pollers);
  o->max_pools.workers = std::max(o->max_pools.workers, o->threading.pools.workers);
  o->max_pools.responders = std::max(o->max_pools.responders, o->threading.pools.responders);
  if (std::string why = ValidateThreading(o->threading, o->max_pools); !why.empty()) {
    *error = why;
    return false;
  }
  o->leaves.clear();
  if (!leaves.empty()) {
    std::stringstream ss(leaves);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty() || item.find(':') == std::string::npos) {
        *error = "--leaves takes HOST:PORT[,HOST:PORT...], bad entry '" + item + "'";
        return false;
      }
      o->leaves.push_back(item);
    }
  }
  for (auto& [k, v] : kv) o->extra[k] = v;
  return true;
}

std::string ServerOptionsUsage() {
  return "framework flags:\n"
         "  --threading auto|MODEL   MODEL = {sync,async}-{inline,dispatch}-{block,poll}\n"
         "  --pollers N --workers N --responders N   pool sizes\n"
         "  --max-pollers N --max-workers N --max-responders N   threads created (4, 8, 4)\n"
         "  --threading-table PATH   decision table for --threading auto\n"
         "  --listen HOST:PORT --port-file PATH --leaves H:P,H:P --leaf-timeout-ms N\n"
         "  --leaf-transport unary|batch   one RPC per leaf call, or batched streams\n"
         "  --shutdown-grace-ms N --contexts-per-cq N --auto-interval-ms N --auto-persist-ms N\n"
         "  --pin p:0,w:1,r:1\n";
}

}  // namespace musku
