// setalgebra_gen: writes an index file + a query file.
//   setalgebra_gen synth   --out DIR [--docs 1000000] [--terms 20000] [--queries 10000] [--seed 1]
//   setalgebra_gen wordnet --out DIR [--wordnet-dir /usr/share/wordnet] [--queries 10000] [--seed 1]
//   setalgebra_gen check   --index PATH      (validates a file; exit 1 with the reason)
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "index.h"

namespace {
int Usage(const char* why) {
  std::fprintf(stderr,
               "setalgebra_gen: %s\nusage: setalgebra_gen synth|wordnet --out DIR [--docs N] [--terms N] "
               "[--queries N] [--seed N] [--wordnet-dir DIR]\n       setalgebra_gen check --index PATH\n",
               why);
  return 2;
}
bool ToU64(const std::string& s, uint64_t lo, uint64_t hi, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("missing command");
  const std::string cmd = argv[1];
  std::map<std::string, std::string> f;
  for (int i = 2; i < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) return Usage(("bad argument " + k).c_str());
    f[k.substr(2)] = argv[i + 1];
  }
  auto num = [&](const char* k, uint64_t def, uint64_t lo, uint64_t hi, uint64_t* out) {
    auto it = f.find(k);
    if (it == f.end()) {
      *out = def;
      return true;
    }
    return ToU64(it->second, lo, hi, out);
  };
  if (cmd == "check") {
    setalgebra::RawIndex raw;
    std::string why = setalgebra::ReadIndexFile(f["index"], &raw);
    if (!why.empty()) {
      std::fprintf(stderr, "setalgebra_gen: %s\n", why.c_str());
      return 1;
    }
    std::printf("{\"docs\": %u, \"terms\": %zu}\n", raw.num_docs, raw.terms.size());
    return 0;
  }
  uint64_t docs, terms, queries, seed;
  if (!num("docs", 1000000, 1, 4294967295ULL, &docs) || !num("terms", 20000, 1, 10000000, &terms) ||
      !num("queries", 10000, 1, 100000000, &queries) || !num("seed", 1, 0, ~0ULL, &seed))
    return Usage("--docs is 1..2^32-1, --terms 1..1e7, --queries 1..1e8, --seed an integer");
  const std::string out = f["out"];
  if (out.empty()) return Usage("--out DIR is required");
  mkdir(out.c_str(), 0755);
  setalgebra::RawIndex raw;
  if (cmd == "synth") {
    raw = setalgebra::Synthesize(static_cast<uint32_t>(docs), static_cast<uint32_t>(terms), seed);
  } else if (cmd == "wordnet") {
    const std::string dir = f.count("wordnet-dir") ? f["wordnet-dir"] : "/usr/share/wordnet";
    if (std::string why = setalgebra::IndexWordNet(dir, &raw); !why.empty()) {
      std::fprintf(stderr, "setalgebra_gen: %s (install wordnet-base)\n", why.c_str());
      return 1;
    }
  } else {
    return Usage(("unknown command " + cmd).c_str());
  }
  if (std::string why = setalgebra::WriteIndexFile(out + "/index.msai", raw); !why.empty()) {
    std::fprintf(stderr, "setalgebra_gen: %s\n", why.c_str());
    return 1;
  }
  auto qs = setalgebra::MakeQueries(raw, queries, seed + 1);
  std::ofstream q(out + "/queries.txt");
  for (const auto& terms_of : qs) {
    for (size_t i = 0; i < terms_of.size(); ++i) q << (i ? " " : "") << terms_of[i];
    q << "\n";
  }
  if (!q) {
    std::fprintf(stderr, "setalgebra_gen: cannot write %s/queries.txt\n", out.c_str());
    return 1;
  }
  uint64_t postings = 0;
  for (auto& t : raw.terms) postings += t.second.size();
  std::printf("{\"index\": \"%s/index.msai\", \"queries\": \"%s/queries.txt\", \"docs\": %u, \"terms\": %zu, "
              "\"postings\": %llu, \"num_queries\": %zu}\n",
              out.c_str(), out.c_str(), raw.num_docs, raw.terms.size(),
              static_cast<unsigned long long>(postings), qs.size());
  return 0;
}
