// recommend_client: predicts the ratings of a (held-out) ratings file over gRPC.
//
//   recommend_client --target h:p --ratings test.bin [--count N] [--out preds.f32]
//   recommend_client --target h:p --user U --item I          (one prediction, printed)
//   recommend_client --ratings test.bin --write-requests FILE  (length-prefixed PredictRequests
//       for musku_loadgen --method /musku.recommend.Recommend/Predict --requests FILE)
//
// Prints one JSON line: queries, errors, first_error_code, rmse, p50_us, p99_us.
// --out: one float32 prediction per rating (NaN where the RPC failed).
// Exit status: 0 all ok, 3 NOT_FOUND, 5 other errors, 2 bad usage / unreadable file.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "ratings.h"
#include "recommend.grpc.pb.h"

namespace {

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument " + k);
    f[k.substr(2)] = argv[i + 1];
  }
  if (argc % 2 == 0) throw std::invalid_argument("flags come in --name value pairs");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace musku::recommend;
  try {
    auto f = ParseFlags(argc, argv);
    auto get = [&](const std::string& k, const std::string& d) { return f.count(k) ? f[k] : d; };
    auto stub = Recommend::NewStub(grpc::CreateChannel(get("target", "127.0.0.1:50051"), grpc::InsecureChannelCredentials()));
    const int timeout_ms = std::atoi(get("timeout-ms", "5000").c_str());
    auto call = [&](std::uint32_t u, std::uint32_t i, PredictReply* reply) {
      PredictRequest req;
      req.set_user(u);
      req.set_item(i);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
      return stub->Predict(&ctx, req, reply);
    };
    if (f.count("user")) {
      PredictReply reply;
      grpc::Status st = call(static_cast<std::uint32_t>(std::stoul(f["user"])),
                             static_cast<std::uint32_t>(std::stoul(get("item", "0"))), &reply);
      if (!st.ok()) {
        std::fprintf(stderr, "status %d: %s\n", static_cast<int>(st.error_code()), st.error_message().c_str());
        return st.error_code() == grpc::StatusCode::NOT_FOUND ? 3 : 5;
      }
      std::printf("%.4f\n", static_cast<double>(reply.rating()));
      std::fprintf(stderr, "leaves answered %u failed %u neighbours %u\n", reply.leaves_answered(),
                   reply.leaves_failed(), reply.neighbours());
      return 0;
    }
    const RatingSet test = ReadRatings(get("ratings", ""));
    std::size_t count = test.ratings.size();
    if (f.count("count")) count = std::min<std::size_t>(count, std::stoul(f["count"]));
    if (f.count("write-requests")) {
      std::FILE* o = std::fopen(f["write-requests"].c_str(), "wb");
      if (o == nullptr) throw std::runtime_error("cannot write " + f["write-requests"]);
      for (std::size_t k = 0; k < count; ++k) {
        PredictRequest req;
        req.set_user(test.ratings[k].user);
        req.set_item(test.ratings[k].item);
        const std::string bytes = req.SerializeAsString();
        const auto len = static_cast<std::uint32_t>(bytes.size());
        std::fwrite(&len, 4, 1, o);
        std::fwrite(bytes.data(), 1, bytes.size(), o);
      }
      if (std::fclose(o) != 0) throw std::runtime_error("cannot write " + f["write-requests"]);
      return 0;
    }
    std::vector<float> preds(count, NAN);
    std::vector<double> lat;
    double se = 0;
    std::size_t errors = 0, ok = 0;
    int first_code = 0;
    for (std::size_t k = 0; k < count; ++k) {
      const Rating& r = test.ratings[k];
      PredictReply reply;
      const auto t0 = std::chrono::steady_clock::now();
      grpc::Status st = call(r.user, r.item, &reply);
      lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (!st.ok()) {
        if (errors++ == 0) {
          first_code = static_cast<int>(st.error_code());
          std::fprintf(stderr, "status %d: %s\n", first_code, st.error_message().c_str());
        }
        continue;
      }
      preds[k] = reply.rating();
      se += (reply.rating() - r.rating) * (reply.rating() - r.rating);
      ++ok;
    }
    if (f.count("out")) {
      std::FILE* o = std::fopen(f["out"].c_str(), "wb");
      if (o == nullptr || (!preds.empty() && std::fwrite(preds.data(), 4, preds.size(), o) != preds.size())) {
        throw std::runtime_error("cannot write " + f["out"]);
      }
      std::fclose(o);
    }
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double p) { return lat.empty() ? 0.0 : lat[static_cast<std::size_t>(p * static_cast<double>(lat.size() - 1))]; };
    std::printf("{\"queries\": %zu, \"errors\": %zu, \"first_error_code\": %d, \"rmse\": %.5f, \"p50_us\": %.1f, "
                "\"p99_us\": %.1f}\n",
                count, errors, first_code, ok ? std::sqrt(se / static_cast<double>(ok)) : 0.0, pct(0.5), pct(0.99));
    return errors == 0 ? 0 : 5;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recommend_client: %s\n", e.what());
    return 2;
  }
}
