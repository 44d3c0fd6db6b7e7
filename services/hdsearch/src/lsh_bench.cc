// hdsearch_lsh_bench: times the mid-tier's LSH candidate lookup (LshIndex::Query, plus the
// grouping of candidates by shard that the mid-tier does next) against brute force over the
// same points, on one core, and prints one JSON object (bench/hdsearch_lsh.py drives it).
//
//   hdsearch_lsh_bench --data data.bin --queries q.bin [--tables 10] [--hashes 10] [--probes 16]
//                      [--width-scale 4] [--k 10] [--rounds 3] [--cold-mb 64]
//
// "warm" runs the queries back to back; "cold" first streams --cold-mb of memory through the
// cache before each query, as an open-loop mid-tier sees between requests at low load.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "lsh.h"
#include "vectors.h"

namespace mh = musku::hdsearch;

namespace {

double NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string data, queries;
  mh::LshParams lsh;
  float width_scale = 4.0f;
  std::size_t k = 10;
  int rounds = 3;
  std::size_t cold_mb = 64;
};

bool Parse(int argc, char** argv, Args* a, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) {
      *err = "flag " + f + " needs a value";
      return false;
    }
    const char* v = argv[++i];
    char* end = nullptr;
    const unsigned long n = std::strtoul(v, &end, 10);
    const bool num_ok = end != v && *end == '\0';
    if (f == "--data") {
      a->data = v;
    } else if (f == "--queries") {
      a->queries = v;
    } else if (f == "--width-scale") {
      a->width_scale = std::strtof(v, &end);
      if (end == v || *end != '\0' || !(a->width_scale > 0)) {
        *err = "--width-scale must be a positive number";
        return false;
      }
    } else if (!num_ok) {
      *err = "flag " + f + " needs a non-negative integer, got '" + v + "'";
      return false;
    } else if (f == "--tables") {
      a->lsh.tables = static_cast<std::uint32_t>(n);
    } else if (f == "--hashes") {
      a->lsh.hashes = static_cast<std::uint32_t>(n);
    } else if (f == "--probes") {
      a->lsh.probes = static_cast<std::uint32_t>(n);
    } else if (f == "--k") {
      a->k = n;
    } else if (f == "--rounds") {
      a->rounds = static_cast<int>(std::max(1ul, n));
    } else if (f == "--cold-mb") {
      a->cold_mb = n;
    } else {
      *err = "unknown flag " + f;
      return false;
    }
  }
  if (a->data.empty() || a->queries.empty()) {
    *err = "--data and --queries are required";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string err;
  if (!Parse(argc, argv, &a, &err)) {
    std::fprintf(stderr, "hdsearch_lsh_bench: %s\n", err.c_str());
    return 2;
  }
  try {
    const mh::VecHeader dh = mh::ReadVecHeader(a.data), qh = mh::ReadVecHeader(a.queries);
    if (dh.dim != qh.dim) throw mh::DataError("data and queries differ in dimension");
    const std::vector<float> data = mh::ReadVecRows(a.data, dh, 0, dh.rows);
    const std::vector<float> queries = mh::ReadVecRows(a.queries, qh, 0, qh.rows);
    const std::uint32_t dim = dh.dim;
    const std::size_t n = dh.rows, nq = qh.rows;
    a.lsh.bucket_width = mh::EstimateBucketWidth(data.data(), n, dim, a.lsh.seed, a.width_scale);
    mh::LshIndex index(dim, a.lsh);
    index.Add(data.data(), n, 0);
    index.Finalize();

    std::vector<char> flush(a.cold_mb << 20, 1);
    volatile char sink = 0;
    auto evict = [&] {
      if (flush.empty()) return;
      for (std::size_t i = 0; i < flush.size(); i += 64) flush[i] = static_cast<char>(flush[i] + 1);
      sink = flush[flush.size() / 2];
    };
    mh::LshScratch scratch;
    std::vector<std::uint32_t> cand;
    double candidates = 0;
    // The mid-tier wants the candidates in ascending order (grouped by shard).
    auto lookup = [&](std::size_t qi) {
      cand.clear();
      index.Query(queries.data() + qi * dim, &scratch, &cand);
      if (!std::is_sorted(cand.begin(), cand.end())) std::sort(cand.begin(), cand.end());
      return cand.size();
    };
    auto timed = [&](bool cold) {
      std::vector<double> us;
      for (int r = 0; r < a.rounds; ++r) {
        for (std::size_t qi = 0; qi < nq; ++qi) {
          if (cold) evict();
          const double t0 = NowUs();
          const std::size_t c = lookup(qi);
          us.push_back(NowUs() - t0);
          if (r == 0 && !cold) candidates += static_cast<double>(c);
        }
      }
      std::sort(us.begin(), us.end());
      double sum = 0;
      for (double x : us) sum += x;
      return std::make_pair(sum / static_cast<double>(us.size()), us[us.size() / 2]);
    };
    const auto warm = timed(false);
    const auto cold = a.cold_mb > 0 ? timed(true) : warm;

    // Recall of the candidate sets (exact distances over them, as the leaves compute) and the
    // brute-force baseline's time per query over the same points.
    double hits = 0, brute_us = 0;
    const std::size_t nb = std::min<std::size_t>(nq, 200);
    for (std::size_t qi = 0; qi < nq; ++qi) {
      const float* q = queries.data() + qi * dim;
      lookup(qi);
      std::vector<std::pair<float, std::uint32_t>> d;
      for (std::uint32_t id : cand) d.emplace_back(mh::SquaredL2(data.data() + std::size_t{id} * dim, q, dim), id);
      const std::size_t kk = std::min(a.k, d.size());
      std::partial_sort(d.begin(), d.begin() + static_cast<long>(kk), d.end());
      std::set<std::uint32_t> got;
      for (std::size_t j = 0; j < kk; ++j) got.insert(d[j].second);
      const double t0 = NowUs();
      const auto truth = mh::BruteForceKnn(data.data(), n, dim, q, a.k);
      if (qi < nb) brute_us += NowUs() - t0;
      for (std::uint32_t id : truth) hits += static_cast<double>(got.count(id));
    }
    std::printf(
        "{\"points\": %zu, \"dim\": %u, \"queries\": %zu, \"tables\": %u, \"hashes\": %u, \"probes\": %u, "
        "\"mean_candidates\": %.1f, \"recall\": %.4f, \"warm_mean_us\": %.2f, \"warm_p50_us\": %.2f, "
        "\"cold_mean_us\": %.2f, \"cold_p50_us\": %.2f, \"brute_force_us\": %.2f}\n",
        n, dim, nq, a.lsh.tables, a.lsh.hashes, a.lsh.probes, candidates / static_cast<double>(nq),
        hits / static_cast<double>(nq * a.k), warm.first, warm.second, cold.first, cold.second,
        brute_us / static_cast<double>(nb));
    (void)sink;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hdsearch_lsh_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
