#include <grpcpp/generic/async_generic_service.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "loadgen.h"
#ifdef MUSKU_LOADGEN_HDSEARCH
#include "hdsearch.pb.h"
#endif
#ifdef MUSKU_LOADGEN_RECOMMEND
#include "recommend.pb.h"
#endif

TEST(Arrivals, ExponentialGapsHaveTheRightMeanAndSpread) {
  loadgen::Arrivals a(7);
  const double qps = 2000;
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double g = static_cast<double>(a.NextGapNs(qps)) / 1e9;
    sum += g;
    sum2 += g * g;
  }
  const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, 1 / qps, 0.01 / qps);
  EXPECT_NEAR(sd / mean, 1.0, 0.02);  // exponential: CV = 1 (periodic traffic would give 0)
}

TEST(Schedule, Parses) {
  std::vector<loadgen::Phase> p;
  EXPECT_EQ(loadgen::ParseSchedule("100:2,5000:1", &p), "");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].qps, 5000);
  EXPECT_NE(loadgen::ParseSchedule("100", &p), "");
  EXPECT_NE(loadgen::ParseSchedule("0:1", &p), "");
  EXPECT_NE(loadgen::ParseSchedule("x:1", &p), "");
  EXPECT_NE(loadgen::ParseSchedule("", &p), "");
}

TEST(Requests, LengthPrefixedFileErrors) {
  loadgen::Workload w;
  EXPECT_NE(loadgen::LoadLengthPrefixed("/nonexistent", "/a.B/C", &w), "");
}

// ---- mixed-method workloads, the load phase, YCSB keys ----------------------------------------

namespace {

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// An in-process server that answers every method OK and records (method, payload) in arrival order.
class Recorder final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor(Recorder* rec, std::string method) : rec_(rec), method_(std::move(method)) { StartRead(&req_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        std::vector<grpc::Slice> slices;
        (void)req_.Dump(&slices);
        std::string body;
        for (auto& s : slices) body.append(reinterpret_cast<const char*>(s.begin()), s.size());
        {
          std::lock_guard<std::mutex> lk(rec_->mu);
          rec_->calls.emplace_back(method_, body);
        }
        resp_ = Bytes("ok");
        StartWriteAndFinish(&resp_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      Recorder* rec_;
      std::string method_;
      grpc::ByteBuffer req_, resp_;
    };
    return new Reactor(this, ctx->method());
  }
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> calls;
};

// A Recorder serving on a loopback port; Start() is false if it could not.
struct RecordingServer {
  Recorder rec;
  std::unique_ptr<grpc::Server> server;
  std::string target;
  bool Start() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterCallbackGenericService(&rec);
    server = b.BuildAndStart();
    target = "127.0.0.1:" + std::to_string(port);
    return server && port > 0;
  }
};

// Closed-loop options against `target`: 0.3 s measured after `warmup_s`.
loadgen::Options ClosedLoop(const std::string& target, int concurrency, double warmup_s) {
  loadgen::Options o;
  o.target = target;
  o.mode = "closed";
  o.concurrency = concurrency;
  o.duration_s = 0.3;
  o.warmup_s = warmup_s;
  return o;
}

}  // namespace

TEST(Workload, MixedMethodsAndALoadPhase) {
  RecordingServer srv;
  ASSERT_TRUE(srv.Start());
  Recorder& rec = srv.rec;

  loadgen::Workload w;
  w.methods = {"/t.S/Get", "/t.S/Set"};
  w.method = w.methods[0];
  for (int i = 0; i < 20; ++i) {  // load phase: 20 sets
    w.requests.push_back(Bytes("load" + std::to_string(i)));
    w.method_of.push_back(1);
  }
  w.preload = 20;
  for (int i = 0; i < 4; ++i) {  // run: get, set, get, get
    w.requests.push_back(Bytes("run" + std::to_string(i)));
    w.method_of.push_back(i == 1 ? 1 : 0);
  }
  ASSERT_EQ(w.Check(), "");
  const loadgen::Options o = ClosedLoop(srv.target, 4, 0);
  loadgen::Result r;
  ASSERT_EQ(loadgen::Run(o, w, &r), "");
  srv.server->Shutdown();

  EXPECT_EQ(r.preloaded, 20u);
  EXPECT_EQ(r.total.errors, 0u);
  ASSERT_GT(r.total.ok, 40u);
  // the load phase came first, each load request exactly once, on its method
  std::set<std::string> loaded;
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(rec.calls[i].first, "/t.S/Set");
    EXPECT_EQ(rec.calls[i].second.rfind("load", 0), 0u) << rec.calls[i].second;
    loaded.insert(rec.calls[i].second);
  }
  EXPECT_EQ(loaded.size(), 20u);
  // then only run requests, each on its own method (run1 is the set), ~1:3 set:get
  std::map<std::string, uint64_t> per_method;
  for (size_t i = 20; i < rec.calls.size(); ++i) {
    const auto& [m, body] = rec.calls[i];
    ASSERT_EQ(body.rfind("run", 0), 0u) << body;
    EXPECT_EQ(m, body == "run1" ? "/t.S/Set" : "/t.S/Get") << body;
    ++per_method[m];
  }
  EXPECT_NEAR(static_cast<double>(per_method["/t.S/Set"]) / static_cast<double>(rec.calls.size() - 20), 0.25, 0.05);
  // the result counts completions per method (measured ones only: <= what the server saw)
  ASSERT_EQ(r.total.methods.size(), 2u);
  EXPECT_EQ(r.total.methods["/t.S/Get"] + r.total.methods["/t.S/Set"], r.total.ok);
  EXPECT_LE(r.total.methods["/t.S/Set"], per_method["/t.S/Set"]);
  EXPECT_NE(loadgen::ToJson(o, r).find("\"methods\": {\"/t.S/Get\": "), std::string::npos);
}

TEST(Workload, WarmUpRequestsAreCountedNotMeasured) {
  // Per-request server CPU needs every request the servers answered: the warm-up's too.
  RecordingServer srv;
  ASSERT_TRUE(srv.Start());
  const Recorder& rec = srv.rec;
  loadgen::Workload w;
  w.method = "/t.S/Get";
  w.requests.push_back(Bytes("q"));
  ASSERT_EQ(w.Check(), "");
  const loadgen::Options o = ClosedLoop(srv.target, 2, 0.3);
  loadgen::Result r;
  ASSERT_EQ(loadgen::Run(o, w, &r), "");
  srv.server->Shutdown();
  EXPECT_GT(r.warmup_answered, 10u);
  EXPECT_GT(r.total.ok, 10u);
  // every request the server saw is accounted for: warm-up + measured (+ the last ones in
  // flight when the run ended, at most the concurrency)
  const uint64_t counted = r.warmup_answered + r.total.ok + r.total.errors;
  EXPECT_LE(counted, rec.calls.size());
  EXPECT_LE(rec.calls.size(), counted + 2);
  EXPECT_NE(loadgen::ToJson(o, r).find("\"warmup_answered\": " + std::to_string(r.warmup_answered)),
            std::string::npos);
}

TEST(Workload, CheckRejectsInconsistentWorkloads) {
  loadgen::Workload w;
  w.method = "/a.B/C";
  w.requests.push_back(Bytes("x"));
  EXPECT_EQ(w.Check(), "");
  w.preload = 1;
  EXPECT_NE(w.Check(), "");  // nothing left for the run
  w.preload = 0;
  w.methods = {"/a.B/C"};
  EXPECT_NE(w.Check(), "");  // method_of missing
  w.method_of = {3};
  EXPECT_NE(w.Check(), "");  // out of range
}

TEST(Zipf, SkewMatchesTheDistribution) {
  const uint64_t n = 1000;
  const double theta = 0.99;
  double h = 0;
  for (uint64_t r = 1; r <= n; ++r) h += 1.0 / std::pow(static_cast<double>(r), theta);
  loadgen::Zipf z(n, theta);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> count(n);
  const int samples = 200000;
  for (int i = 0; i < samples; ++i) ++count[z.Sample(rng)];
  for (uint64_t r : {0, 1, 9, 99}) {
    const double want = 1.0 / std::pow(static_cast<double>(r + 1), theta) / h;
    EXPECT_NEAR(static_cast<double>(count[r]) / samples, want, 4 * std::sqrt(want / samples) + 1e-4) << r;
  }
  loadgen::Zipf uniform(10, 0.0);
  std::vector<int> u(10);
  for (int i = 0; i < 100000; ++i) ++u[uniform.Sample(rng)];
  for (int c : u) EXPECT_NEAR(c, 10000, 500);
}

namespace {
std::string TempFile(const std::string& text) {
  char name[] = "/tmp/loadgen-test-XXXXXX";
  const int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(name) << text;
  return name;
}
}  // namespace

TEST(Ycsb, SpecParsesAndGeneratesSeededWorkloadA) {
  const std::string path = TempFile("# workload A\nrecords 500\noperations=20000\nzipf 0.99\nseed 7\n");
  loadgen::YcsbSpec spec;
  ASSERT_EQ(loadgen::ParseYcsbSpec(path, &spec), "");
  EXPECT_EQ(spec.records, 500);
  EXPECT_EQ(spec.read_proportion, 0.5);  // default: workload A
  const auto a = loadgen::GenerateYcsb(spec), b = loadgen::GenerateYcsb(spec);
  EXPECT_EQ(a.key, b.key);  // seeded
  ASSERT_EQ(a.key.size(), 20000u);
  const auto reads = std::count(a.is_read.begin(), a.is_read.end(), true);
  EXPECT_NEAR(static_cast<double>(reads) / 20000, 0.5, 0.02);
  std::map<uint64_t, int> freq;
  for (auto k : a.key) {
    ASSERT_LT(k, 500u);
    ++freq[k];
  }
  int top = 0;
  for (auto& [k, c] : freq) top = std::max(top, c);
  EXPECT_GT(top, 20000 / 20);  // the hottest key: ~1/H(500, 0.99) ~ 14 % of operations
  spec.seed = 8;
  EXPECT_NE(loadgen::GenerateYcsb(spec).key, a.key);
  std::remove(path.c_str());

  for (const char* bad : {"records 0\n", "zipf -1\n", "nosuch 1\n", "records\n", "read_proportion 2\n", "records x\n"}) {
    const std::string p = TempFile(bad);
    loadgen::YcsbSpec s;
    EXPECT_NE(loadgen::ParseYcsbSpec(p, &s), "") << bad;
    std::remove(p.c_str());
  }
}

#ifdef MUSKU_LOADGEN_ROUTER
TEST(Plugins, RouterIsYcsbAOverGetAndSet) {
  loadgen::RegisterBuiltinPlugins();
  const std::string path = TempFile("records 300\noperations 4000\nvalue_bytes 64\n");
  loadgen::Workload w;
  ASSERT_EQ(loadgen::Plugins().at("router")(path, &w), "");
  std::remove(path.c_str());
  EXPECT_EQ(w.Check(), "");
  EXPECT_EQ(w.preload, 300u);
  EXPECT_EQ(w.requests.size(), 4300u);
  for (size_t i = 0; i < w.preload; ++i) ASSERT_EQ(w.MethodOf(i), "/musku.router.Router/Set");
  size_t gets = 0;
  for (size_t i = w.preload; i < w.requests.size(); ++i) gets += w.MethodOf(i) == "/musku.router.Router/Get";
  EXPECT_NEAR(static_cast<double>(gets) / 4000, 0.5, 0.04);
}
#endif

#if defined(MUSKU_LOADGEN_HDSEARCH) || defined(MUSKU_LOADGEN_RECOMMEND)
namespace {
template <typename Msg>
Msg Parse(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  Msg m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

std::string Binary(const std::string& magic, const std::string& header_rest, const std::string& body) {
  return TempFile(magic + header_rest + body);
}

template <typename T>
std::string Raw(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}
}  // namespace
#endif

#ifdef MUSKU_LOADGEN_HDSEARCH
TEST(Plugins, HdSearchSendsOneKnnQueryPerVector) {
  loadgen::RegisterBuiltinPlugins();
  std::string rows;
  for (float f : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) rows += Raw(f);
  // MKUVEC01, rows u64, dim u32, dtype u32 (0 = f32), 8 reserved bytes
  const std::string head = Raw(uint64_t{2}) + Raw(uint32_t{3}) + Raw(uint32_t{0}) + std::string(8, '\0');
  const std::string path = Binary("MKUVEC01", head, rows);
  loadgen::Workload w;
  ASSERT_EQ(loadgen::Plugins().at("hdsearch")(path, &w), "");
  std::remove(path.c_str());
  EXPECT_EQ(w.method, "/musku.hdsearch.HDSearch/Search");
  ASSERT_EQ(w.requests.size(), 2u);
  const auto q = Parse<musku::hdsearch::SearchRequest>(w.requests[1]);
  EXPECT_EQ(q.k(), 10u);
  ASSERT_EQ(q.query_size(), 3);
  EXPECT_EQ(q.query(0), 4.f);
  EXPECT_EQ(q.query(2), 6.f);

  const std::string bad_magic = Binary("NOTAVEC!", head, rows);
  const std::string truncated = Binary("MKUVEC01", head, rows.substr(0, 20));
  for (const auto& p : {bad_magic, truncated, std::string("/nonexistent/q.bin")}) {
    loadgen::Workload x;
    EXPECT_NE(loadgen::Plugins().at("hdsearch")(p, &x), "") << p;
    std::remove(p.c_str());
  }
}
#endif

#ifdef MUSKU_LOADGEN_RECOMMEND
TEST(Plugins, RecommendReadsRatingsFilesAndPairLines) {
  loadgen::RegisterBuiltinPlugins();
  // MKURAT01, users u32, items u32, count u64, then (u32 user, u32 item, f32 rating)
  const std::string body = Raw(uint32_t{7}) + Raw(uint32_t{3}) + Raw(4.5f) + Raw(uint32_t{1}) + Raw(uint32_t{2}) + Raw(1.f);
  const std::string rat = Binary("MKURAT01", Raw(uint32_t{8}) + Raw(uint32_t{4}) + Raw(uint64_t{2}), body);
  const std::string txt = TempFile("# user,item\n7,3\n\n1 2 5.0\n");
  for (const auto& p : {rat, txt}) {
    loadgen::Workload w;
    ASSERT_EQ(loadgen::Plugins().at("recommend")(p, &w), "") << p;
    EXPECT_EQ(w.method, "/musku.recommend.Recommend/Predict");
    ASSERT_EQ(w.requests.size(), 2u) << p;
    const auto a = Parse<musku::recommend::PredictRequest>(w.requests[0]);
    const auto b = Parse<musku::recommend::PredictRequest>(w.requests[1]);
    EXPECT_EQ(a.user(), 7u);
    EXPECT_EQ(a.item(), 3u);
    EXPECT_EQ(b.user(), 1u);
    EXPECT_EQ(b.item(), 2u);
    std::remove(p.c_str());
  }
  const std::string short_rat = Binary("MKURAT01", Raw(uint32_t{8}) + Raw(uint32_t{4}) + Raw(uint64_t{3}), body);
  const std::string bad_line = TempFile("7,3\nseven,3\n");
  const std::string empty = TempFile("# nothing\n");
  for (const auto& p : {short_rat, bad_line, empty}) {
    loadgen::Workload w;
    EXPECT_NE(loadgen::Plugins().at("recommend")(p, &w), "") << p;
    std::remove(p.c_str());
  }
}
#endif
