// hdsearch_client: sends queries from a vector file, records the answers and latencies.
//
//   hdsearch_client --target h:p --queries q.bin [--k 10] [--count N] [--out ids.bin]
//                   [--truncate-dim D] (send only D dimensions: a malformed request)
//   hdsearch_client --queries q.bin --write-requests FILE [--k 10] [--count N]
//       writes the SearchRequests, length-prefixed (u32 LE), for
//       musku_loadgen --method /musku.hdsearch.HDSearch/Search --requests FILE
//
// --out: count x k uint32 ids, row-major, 0xffffffff where fewer than k came back.
// Prints one JSON line: queries, errors, first_error_code, p50_us, p99_us, mean_candidates.
// Exit status 0 when every query succeeded, 5 otherwise.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "musku/flags.h"
#include "hdsearch.grpc.pb.h"
#include "vectors.h"

using musku::Flags;

int main(int argc, char** argv) {
  using namespace musku::hdsearch;
  try {
    Flags flags(argc, argv);
    const std::string target = flags.Str("target", "127.0.0.1:50051");
    const std::string queries = flags.Str("queries", "");
    const auto k = flags.Int("k", 10);
    auto count = flags.Int("count", 0);
    const std::string out = flags.Str("out", "");
    const auto truncate = flags.Int("truncate-dim", -1);
    const auto timeout_ms = flags.Int("timeout-ms", 5000);
    const std::string write_requests = flags.Str("write-requests", "");
    flags.CheckAllUsed();
    const VecHeader h = ReadVecHeader(queries);
    if (count <= 0 || static_cast<std::uint64_t>(count) > h.rows) count = static_cast<std::int64_t>(h.rows);
    const std::vector<float> q = ReadVecRows(queries, h, 0, static_cast<std::uint64_t>(count));
    if (!write_requests.empty()) {
      std::FILE* f = std::fopen(write_requests.c_str(), "wb");
      if (f == nullptr) throw std::runtime_error("cannot write " + write_requests);
      for (std::int64_t i = 0; i < count; ++i) {
        SearchRequest req;
        req.mutable_query()->Add(q.begin() + i * h.dim, q.begin() + (i + 1) * h.dim);
        req.set_k(static_cast<std::uint32_t>(k));
        const std::string bytes = req.SerializeAsString();
        const auto len = static_cast<std::uint32_t>(bytes.size());
        std::fwrite(&len, 4, 1, f);
        std::fwrite(bytes.data(), 1, bytes.size(), f);
      }
      if (std::fclose(f) != 0) throw std::runtime_error("cannot write " + write_requests);
      return 0;
    }
    auto stub = HDSearch::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    std::vector<std::uint32_t> ids(static_cast<std::size_t>(count * k), 0xffffffffu);
    std::vector<double> lat;
    std::int64_t errors = 0;
    int first_code = 0;
    double cand = 0;
    const std::size_t send_dim = truncate >= 0 ? static_cast<std::size_t>(truncate) : h.dim;
    for (std::int64_t i = 0; i < count; ++i) {
      SearchRequest req;
      req.mutable_query()->Add(q.begin() + i * h.dim, q.begin() + i * h.dim + static_cast<long>(send_dim));
      req.set_k(static_cast<std::uint32_t>(k));
      SearchReply reply;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
      const auto t0 = std::chrono::steady_clock::now();
      grpc::Status st = stub->Search(&ctx, req, &reply);
      lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (!st.ok()) {
        if (errors++ == 0) {
          first_code = static_cast<int>(st.error_code());
          std::fprintf(stderr, "status %d: %s\n", first_code, st.error_message().c_str());
        }
        continue;
      }
      cand += reply.candidates();
      for (int j = 0; j < reply.ids_size() && j < k; ++j) ids[static_cast<std::size_t>(i * k + j)] = reply.ids(j);
    }
    if (!out.empty()) {
      std::FILE* f = std::fopen(out.c_str(), "wb");
      if (f == nullptr || (!ids.empty() && std::fwrite(ids.data(), 4, ids.size(), f) != ids.size())) {
        throw std::runtime_error("cannot write " + out);
      }
      std::fclose(f);
    }
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double p) { return lat[static_cast<std::size_t>(p * static_cast<double>(lat.size() - 1))]; };
    std::printf("{\"queries\": %lld, \"errors\": %lld, \"first_error_code\": %d, \"p50_us\": %.1f, "
                "\"p99_us\": %.1f, \"mean_candidates\": %.1f}\n",
                static_cast<long long>(count), static_cast<long long>(errors), first_code, pct(0.5), pct(0.99),
                cand / static_cast<double>(std::max<std::int64_t>(1, count - errors)));
    return errors == 0 ? 0 : 5;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hdsearch_client: %s\n", e.what());
    return 2;
  }
}
