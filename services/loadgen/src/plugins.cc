// Built-in request plug-ins: turn a service's data file into serialized requests.
//
// A service's plug-in is compiled in when its proto library is part of the build (CMake defines
// MUSKU_LOADGEN_<SERVICE>); the test-only sanitizer build has Set Algebra's only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "loadgen.h"
#include "setalgebra.pb.h"
#ifdef MUSKU_LOADGEN_HDSEARCH
#include "hdsearch.pb.h"
#endif
#ifdef MUSKU_LOADGEN_ROUTER
#include "router.pb.h"
#endif
#ifdef MUSKU_LOADGEN_RECOMMEND
#include "recommend.pb.h"
#endif

namespace loadgen {

// ---- YCSB-style workload spec and Zipf keys (no protos needed) ------------------------------

Zipf::Zipf(uint64_t n, double theta) {
  cdf_.resize(n);
  double sum = 0;
  for (uint64_t r = 0; r < n; ++r) cdf_[r] = (sum += 1.0 / std::pow(static_cast<double>(r + 1), theta));
  for (double& c : cdf_) c /= sum;
}

uint64_t Zipf::Sample(std::mt19937_64& rng) const {
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
  return it == cdf_.end() ? cdf_.size() - 1 : static_cast<uint64_t>(it - cdf_.begin());
}

std::string ParseYcsbSpec(const std::string& path, YcsbSpec* out) {
  std::ifstream in(path);
  if (!in) return "cannot read workload file " + path;
  std::map<std::string, double*> fields = {
      {"records", &out->records},         {"operations", &out->operations}, {"read_proportion", &out->read_proportion},
      {"zipf", &out->zipf},               {"value_bytes", &out->value_bytes}, {"seed", &out->seed},
  };
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (auto h = line.find('#'); h != std::string::npos) line.erase(h);
    std::replace(line.begin(), line.end(), '=', ' ');
    std::istringstream ss(line);
    std::string key, value, rest;
    if (!(ss >> key)) continue;
    const auto it = fields.find(key);
    if (it == fields.end()) return path + ":" + std::to_string(n) + ": unknown field '" + key + "'";
    char* end = nullptr;
    if (!(ss >> value) || (ss >> rest)) return path + ":" + std::to_string(n) + ": want '" + key + " VALUE'";
    const double v = std::strtod(value.c_str(), &end);
    if (*end || !std::isfinite(v)) return path + ":" + std::to_string(n) + ": '" + value + "' is not a number";
    *it->second = v;
  }
  auto whole = [](double v) { return v == std::floor(v); };
  if (!(out->records >= 1 && out->records <= 1e7 && whole(out->records)))
    return path + ": records must be an integer in 1..10000000";
  if (!(out->operations >= 1 && out->operations <= 1e7 && whole(out->operations)))
    return path + ": operations must be an integer in 1..10000000";
  if (!(out->read_proportion >= 0 && out->read_proportion <= 1)) return path + ": read_proportion must be in [0, 1]";
  if (!(out->zipf >= 0 && out->zipf <= 10)) return path + ": zipf must be in [0, 10] (0 = uniform)";
  if (!(out->value_bytes >= 1 && out->value_bytes <= 1e6 && whole(out->value_bytes)))
    return path + ": value_bytes must be an integer in 1..1000000";
  if (!(out->seed >= 0 && whole(out->seed))) return path + ": seed must be a non-negative integer";
  return "";
}

YcsbOps GenerateYcsb(const YcsbSpec& spec) {
  YcsbOps ops;
  const auto records = static_cast<uint64_t>(spec.records);
  std::mt19937_64 rng(static_cast<uint64_t>(spec.seed));
  // Scramble popularity over the key space (YCSB's ScrambledZipfian, as a seeded permutation:
  // hot keys are spread over ids instead of being the smallest ones).
  std::vector<uint64_t> id_of_rank(records);
  std::iota(id_of_rank.begin(), id_of_rank.end(), 0);
  std::shuffle(id_of_rank.begin(), id_of_rank.end(), rng);
  const Zipf zipf(records, spec.zipf);
  std::bernoulli_distribution read(spec.read_proportion);
  const auto n = static_cast<uint64_t>(spec.operations);
  ops.key.reserve(n);
  ops.is_read.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    ops.key.push_back(id_of_rank[zipf.Sample(rng)]);
    ops.is_read.push_back(read(rng));
  }
  return ops;
}

std::string YcsbKey(uint64_t id) { return "user" + std::to_string(id); }

namespace {

grpc::ByteBuffer Serialize(const google::protobuf::Message& m) {
  std::string s;
  m.SerializeToString(&s);
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

#if defined(MUSKU_LOADGEN_HDSEARCH) || defined(MUSKU_LOADGEN_RECOMMEND)
std::string ReadFile(const std::string& path, const char* what, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::string("cannot read ") + what + " " + path;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return "";
}
#endif

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

#ifdef MUSKU_LOADGEN_HDSEARCH
// hdsearch: a query vector file (MKUVEC01, services/hdsearch/src/vectors.h) -> one k=10 Search per row.
constexpr uint32_t kHdSearchK = 10;

std::string HdSearch(const std::string& path, Workload* out) {
  std::string buf;
  if (std::string why = ReadFile(path, "query vectors file", &buf); !why.empty()) return why;
  if (buf.size() < 32 || std::memcmp(buf.data(), "MKUVEC01", 8) != 0) return path + ": not a musku vector file (bad magic)";
  uint64_t rows = 0;
  uint32_t dim = 0, dtype = 0;
  std::memcpy(&rows, buf.data() + 8, 8);
  std::memcpy(&dim, buf.data() + 16, 4);
  std::memcpy(&dtype, buf.data() + 20, 4);
  if (dtype != 0 || dim == 0) return path + ": unsupported dtype or dim 0";
  if (rows == 0 || rows > (buf.size() - 32) / 4 / dim || buf.size() != 32 + rows * dim * 4)
    return path + ": size does not match the header (truncated or corrupt)";
  out->method = "/musku.hdsearch.HDSearch/Search";
  out->requests.clear();
  std::vector<float> row(dim);
  for (uint64_t r = 0; r < rows; ++r) {
    std::memcpy(row.data(), buf.data() + 32 + r * dim * 4, dim * 4);
    musku::hdsearch::SearchRequest q;
    q.mutable_query()->Add(row.begin(), row.end());
    q.set_k(kHdSearchK);
    out->requests.push_back(Serialize(q));
  }
  return "";
}
#endif

#ifdef MUSKU_LOADGEN_RECOMMEND
// recommend: (user, item) pairs -> Predict. Either a ratings file (MKURAT01,
// services/recommend/src/ratings.h; e.g. the held-out test file) or text lines "user,item[,...]" /
// "user item [...]" ('#' comments).
std::string Recommend(const std::string& path, Workload* out) {
  std::string buf;
  if (std::string why = ReadFile(path, "pairs file", &buf); !why.empty()) return why;
  out->method = "/musku.recommend.Recommend/Predict";
  out->requests.clear();
  auto add = [&](uint32_t user, uint32_t item) {
    musku::recommend::PredictRequest q;
    q.set_user(user);
    q.set_item(item);
    out->requests.push_back(Serialize(q));
  };
  if (buf.compare(0, 8, "MKURAT01") == 0) {
    if (buf.size() < 24) return path + ": truncated ratings header";
    uint64_t count = 0;
    std::memcpy(&count, buf.data() + 16, 8);
    if (buf.size() != 24 + count * 12) return path + ": size does not match the header (truncated or corrupt)";
    for (uint64_t i = 0; i < count; ++i) {
      uint32_t ui[2];
      std::memcpy(ui, buf.data() + 24 + i * 12, 8);
      add(ui[0], ui[1]);
    }
  } else {
    std::istringstream in(buf);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (auto h = line.find('#'); h != std::string::npos) line.erase(h);
      std::replace(line.begin(), line.end(), ',', ' ');
      std::istringstream ss(line);
      long long user = -1, item = -1;
      std::string first;
      if (!(ss >> first)) continue;
      std::istringstream fs(first);
      if (!(fs >> user) || !(ss >> item) || user < 0 || item < 0 || user > UINT32_MAX || item > UINT32_MAX)
        return path + ":" + std::to_string(n) + ": want 'USER,ITEM' (non-negative integer ids)";
      add(static_cast<uint32_t>(user), static_cast<uint32_t>(item));
    }
  }
  if (out->requests.empty()) return path + " holds no (user, item) pairs";
  return "";
}
#endif

#ifdef MUSKU_LOADGEN_ROUTER
// router: YCSB (workload A by default: 50/50 get/set, Zipf 0.99 keys) from a workload spec file
// (see YcsbSpec). The load phase sets every record once, so gets find their keys.
std::string Router(const std::string& path, Workload* out) {
  YcsbSpec spec;
  if (std::string why = ParseYcsbSpec(path, &spec); !why.empty()) return why;
  const auto records = static_cast<uint64_t>(spec.records);
  const YcsbOps ops = GenerateYcsb(spec);
  out->methods = {"/musku.router.Router/Get", "/musku.router.Router/Set"};
  out->method = out->methods[0];
  out->requests.clear();
  out->method_of.clear();
  out->requests.reserve(records + ops.key.size());
  // Values: printable, different per request (a rotating window over a seeded alphabet).
  const auto vbytes = static_cast<size_t>(spec.value_bytes);
  std::mt19937_64 rng(static_cast<uint64_t>(spec.seed) ^ 0x9e3779b97f4a7c15ULL);
  std::string pool(vbytes + 4096, ' ');
  for (char& c : pool) c = static_cast<char>('a' + rng() % 26);
  auto set = [&](uint64_t id, uint64_t salt) {
    musku::router::SetRequest q;
    q.set_key(YcsbKey(id));
    q.set_value(pool.substr(salt % 4096, vbytes));
    out->requests.push_back(Serialize(q));
    out->method_of.push_back(1);
  };
  for (uint64_t id = 0; id < records; ++id) set(id, id);
  out->preload = records;
  for (size_t i = 0; i < ops.key.size(); ++i) {
    if (ops.is_read[i]) {
      musku::router::GetRequest q;
      q.set_key(YcsbKey(ops.key[i]));
      out->requests.push_back(Serialize(q));
      out->method_of.push_back(0);
    } else {
      set(ops.key[i], i * 7919);
    }
  }
  return "";
}
#endif

}  // namespace

void RegisterBuiltinPlugins() {
  Plugins()["setalgebra"] = SetAlgebra;
#ifdef MUSKU_LOADGEN_HDSEARCH
  Plugins()["hdsearch"] = HdSearch;
#endif
#ifdef MUSKU_LOADGEN_RECOMMEND
  Plugins()["recommend"] = Recommend;
#endif
#ifdef MUSKU_LOADGEN_ROUTER
  Plugins()["router"] = Router;
#endif
}

}  // namespace loadgen
