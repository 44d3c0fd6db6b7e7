// router_client: one-shot get/set, and a closed-loop YCSB-A benchmark (50/50 get/set, Zipf keys).
//
//   router_client --target h:p --op get --key K
//   router_client --target h:p --op set --key K --value V
//   router_client --target h:p --op bench [--requests 10000] [--keys 10000] [--zipf 0.99]
//                 [--value-bytes 128] [--seed 1] [--leaf]   (--leaf: talk to a RouterLeaf)
//   router_client --op requests --method get|set --out FILE [--requests N --keys K --zipf S]
//       writes Zipf-keyed Get or Set requests, length-prefixed (u32 LE), for
//       musku_loadgen --method /musku.router.Router/Get --requests FILE
//
// get prints the value on stdout; exit status: 0 ok, 3 NOT_FOUND, 4 INVALID_ARGUMENT,
// 5 UNAVAILABLE/other. bench prints one JSON line with latency percentiles.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "musku/flags.h"
#include "router.grpc.pb.h"

using musku::Flags;

namespace musku::router {
namespace {

int ExitFor(const grpc::Status& st) {
  if (st.ok()) return 0;
  std::fprintf(stderr, "status %d: %s\n", static_cast<int>(st.error_code()), st.error_message().c_str());
  switch (st.error_code()) {
    case grpc::StatusCode::NOT_FOUND: return 3;
    case grpc::StatusCode::INVALID_ARGUMENT: return 4;
    default: return 5;
  }
}

// Zipf(s) over ranks 1..n by inverse CDF over a precomputed table (exact, O(log n) per draw).
class Zipf {
 public:
  Zipf(std::uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
      cdf_[i] = sum;
    }
    for (double& c : cdf_) c /= sum;
  }
  template <class Rng>
  std::uint64_t operator()(Rng& rng) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    return static_cast<std::uint64_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

template <class Stub>
int Main(Flags& flags, Stub& stub) {
  const std::string op = flags.Str("op", "get");
  const std::string key = flags.Str("key", "");
  const std::string value = flags.Str("value", "");
  const auto requests = flags.Int("requests", 10000);
  const auto keys = flags.Int("keys", 10000);
  const double zipf_s = flags.Double("zipf", 0.99);
  const auto value_bytes = flags.Int("value-bytes", 128);
  const auto seed = flags.Int("seed", 1);
  const auto timeout_ms = flags.Int("timeout-ms", 2000);
  const std::string method = flags.Str("method", "get");
  const std::string out = flags.Str("out", "");
  flags.CheckAllUsed();
  auto deadline = [&] { return std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms); };
  if (op == "get") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    GetRequest req;
    req.set_key(key);
    GetReply reply;
    grpc::Status st = stub.Get(&ctx, req, &reply);
    if (st.ok()) {
      std::fwrite(reply.value().data(), 1, reply.value().size(), stdout);
      std::fprintf(stdout, "\n");
      std::fprintf(stderr, "leaf %u attempts %u\n", reply.leaf(), reply.attempts());
    }
    return ExitFor(st);
  }
  if (op == "set") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    SetRequest req;
    req.set_key(key);
    req.set_value(value);
    SetReply reply;
    grpc::Status st = stub.Set(&ctx, req, &reply);
    if (st.ok()) std::printf("stored %u of %u\n", reply.stored(), reply.replicas());
    return ExitFor(st);
  }
  if (op != "bench" && op != "requests") throw std::invalid_argument("--op must be get, set, bench or requests");
  if (keys <= 0 || requests <= 0) throw std::invalid_argument("--keys and --requests must be > 0");
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  Zipf zipf(static_cast<std::uint64_t>(keys), zipf_s);
  const std::string payload(static_cast<std::size_t>(value_bytes), 'v');
  if (op == "requests") {
    if (out.empty() || (method != "get" && method != "set")) {
      throw std::invalid_argument("--op requests needs --method get|set and --out FILE");
    }
    std::FILE* f = std::fopen(out.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error("cannot write " + out);
    for (std::int64_t i = 0; i < requests; ++i) {
      std::string bytes;
      if (method == "get") {
        GetRequest req;
        req.set_key("user" + std::to_string(zipf(rng)));
        bytes = req.SerializeAsString();
      } else {
        SetRequest req;
        req.set_key("user" + std::to_string(zipf(rng)));
        req.set_value(payload);
        bytes = req.SerializeAsString();
      }
      const auto len = static_cast<std::uint32_t>(bytes.size());
      std::fwrite(&len, 4, 1, f);
      std::fwrite(bytes.data(), 1, bytes.size(), f);
    }
    if (std::fclose(f) != 0) throw std::runtime_error("cannot write " + out);
    return 0;
  }
  std::vector<double> lat_us;
  lat_us.reserve(static_cast<std::size_t>(requests));
  std::uint64_t errors = 0, misses = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < requests; ++i) {
    const std::string k = "user" + std::to_string(zipf(rng));
    const bool is_get = (rng() & 1) != 0;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const auto start = std::chrono::steady_clock::now();
    grpc::Status st;
    if (is_get) {
      GetRequest req;
      req.set_key(k);
      GetReply reply;
      st = stub.Get(&ctx, req, &reply);
    } else {
      SetRequest req;
      req.set_key(k);
      req.set_value(payload);
      SetReply reply;
      st = stub.Set(&ctx, req, &reply);
    }
    lat_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      ++misses;
    } else if (!st.ok()) {
      ++errors;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(lat_us.begin(), lat_us.end());
  auto pct = [&](double p) { return lat_us[static_cast<std::size_t>(p * static_cast<double>(lat_us.size() - 1))]; };
  std::printf("{\"requests\": %lld, \"errors\": %llu, \"misses\": %llu, \"qps\": %.1f, "
              "\"p50_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f}\n",
              static_cast<long long>(requests), static_cast<unsigned long long>(errors),
              static_cast<unsigned long long>(misses), static_cast<double>(requests) / secs, pct(0.5),
              pct(0.99), lat_us.back());
  return errors == 0 ? 0 : 5;
}

}  // namespace
}  // namespace musku::router

int main(int argc, char** argv) {
  try {
    musku::Flags flags(argc, argv);
    const std::string target = flags.Str("target", "127.0.0.1:50051");
    const bool leaf = flags.Has("leaf");
    flags.Str("leaf", "");
    auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    if (leaf) {
      auto stub = musku::router::RouterLeaf::NewStub(channel);
      return musku::router::Main(flags, *stub);
    }
    auto stub = musku::router::Router::NewStub(channel);
    return musku::router::Main(flags, *stub);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "router_client: %s\n", e.what());
    return 2;
  }
}
