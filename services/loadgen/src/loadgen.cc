#include "loadgen.h"

#include <sys/prctl.h>

#include <time.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace loadgen {
namespace {

int64_t Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void SleepUntil(int64_t t) {
  timespec ts{};
  ts.tv_sec = t / 1000000000;
  ts.tv_nsec = t % 1000000000;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer reply;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc;
  int64_t intended = 0;
  int phase = -1;  // -1 = warm-up
  size_t index = 0;  // into Workload::requests
};

struct Shared {
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs;
  std::atomic<int64_t> outstanding{0};
  std::atomic<uint64_t> next{0};
  std::mutex mu;  // guards results
  Result* res;
  const Workload* w;
  const Options* opt;
  std::vector<int64_t> phase_end;  // absolute ns, measured phases

  void Send(int64_t intended, int phase) {
    const uint64_t i = next.fetch_add(1);
    auto* c = new Call;
    c->intended = intended;
    c->phase = phase;
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(opt->timeout_ms));
    const size_t ch = i % stubs.size();
    c->index = w->RunIndex(i);
    c->rpc = stubs[ch]->PrepareUnaryCall(&c->ctx, w->MethodOf(c->index), w->requests[c->index],
                                         cqs[i % cqs.size()].get());
    outstanding.fetch_add(1);
    c->rpc->StartCall();
    c->rpc->Finish(&c->reply, &c->status, c);
  }

  void Record(Call* c, int64_t done) {
    std::lock_guard<std::mutex> lk(mu);
    if (c->phase < 0) {  // warm-up: counted (servers' CPU covers it too), not measured
      ++res->warmup_answered;
      return;
    }
    PhaseResult& p = res->phases[static_cast<size_t>(c->phase)];
    ++p.codes[c->status.error_code()];
    if (!w->methods.empty()) ++p.methods[w->MethodOf(c->index)];
    if (c->status.ok()) {
      ++p.ok;
      p.latency.Record(done - c->intended);
    } else {
      ++p.errors;
    }
  }
};

// The load phase: requests [0, w.preload) once each, `concurrency` outstanding, on this thread.
std::string Preload(Shared& sh, int concurrency, uint64_t* sent) {
  const Workload& w = *sh.w;
  grpc::CompletionQueue cq;
  size_t next = 0, done = 0;
  std::string err;
  auto send = [&] {
    auto* c = new Call;
    c->index = next++;
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(sh.opt->timeout_ms));
    c->rpc = sh.stubs[c->index % sh.stubs.size()]->PrepareUnaryCall(&c->ctx, w.MethodOf(c->index),
                                                                   w.requests[c->index], &cq);
    c->rpc->StartCall();
    c->rpc->Finish(&c->reply, &c->status, c);
  };
  for (int i = 0; i < concurrency && next < w.preload; ++i) send();
  void* tag;
  bool ok;
  while (done < next && cq.Next(&tag, &ok)) {
    auto* c = static_cast<Call*>(tag);
    ++done;
    if (!c->status.ok() && err.empty())
      err = "load phase: request " + std::to_string(c->index) + " (" + w.MethodOf(c->index) +
            ") failed with status " + std::to_string(c->status.error_code()) + ": " + c->status.error_message();
    delete c;
    if (err.empty() && next < w.preload) send();
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  *sent = done;
  return err;
}

}  // namespace

std::string Workload::Check() const {
  if (requests.size() <= preload) return "no requests to send (after the load phase)";
  if (!methods.empty()) {
    if (method_of.size() != requests.size()) return "method_of does not match the requests";
    for (auto m : method_of)
      if (m >= methods.size()) return "method index out of range";
  }
  return "";
}

std::map<std::string, Plugin>& Plugins() {
  static std::map<std::string, Plugin> m;
  return m;
}

std::string LoadLengthPrefixed(const std::string& path, const std::string& method, Workload* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot read requests file " + path;
  std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t off = 0;
  out->method = method;
  out->requests.clear();
  while (off < buf.size()) {
    if (off + 4 > buf.size()) return path + " is truncated (length prefix)";
    uint32_t len = 0;
    std::memcpy(&len, buf.data() + off, 4);
    off += 4;
    if (off + len > buf.size()) return path + " is truncated (request " + std::to_string(out->requests.size()) + ")";
    grpc::Slice s(buf.data() + off, len);
    out->requests.emplace_back(&s, 1);
    off += len;
  }
  if (out->requests.empty()) return path + " holds no requests";
  return "";
}

std::string ParseSchedule(const std::string& s, std::vector<Phase>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto c = item.find(':');
    char* e1 = nullptr;
    char* e2 = nullptr;
    if (c == std::string::npos) return "schedule entries are QPS:SECONDS, not '" + item + "'";
    const std::string a = item.substr(0, c), b = item.substr(c + 1);
    Phase p{std::strtod(a.c_str(), &e1), std::strtod(b.c_str(), &e2)};
    if (a.empty() || b.empty() || *e1 || *e2 || !(p.qps > 0) || !(p.seconds > 0) || !std::isfinite(p.qps))
      return "schedule entries are QPS:SECONDS with both > 0, not '" + item + "'";
    out->push_back(p);
  }
  if (out->empty()) return "empty schedule";
  return "";
}

std::string Run(const Options& opt, const Workload& w, Result* out) {
  if (std::string why = w.Check(); !why.empty()) return why;
  Shared sh;
  sh.res = out;
  sh.w = &w;
  sh.opt = &opt;
  for (int i = 0; i < opt.channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // separate connections
    auto ch = grpc::CreateCustomChannel(opt.target, grpc::InsecureChannelCredentials(), args);
    if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)))
      return "cannot connect to " + opt.target;
    sh.stubs.push_back(std::make_unique<grpc::GenericStub>(ch));
  }
  for (int i = 0; i < opt.cq_threads; ++i) sh.cqs.push_back(std::make_unique<grpc::CompletionQueue>());
  if (w.preload > 0) {
    if (std::string err = Preload(sh, opt.concurrency, &out->preloaded); !err.empty()) return err;
  }
  const bool closed = opt.mode == "closed";
  std::vector<Phase> phases = closed ? std::vector<Phase>{{0, opt.duration_s}} : opt.phases;
  out->phases.assign(phases.size(), PhaseResult{});
  for (size_t i = 0; i < phases.size(); ++i) out->phases[i].phase = phases[i];
  const int64_t start = Now();
  const int64_t measure = start + static_cast<int64_t>(opt.warmup_s * 1e9);
  int64_t t = measure;
  for (auto& p : phases) sh.phase_end.push_back(t += static_cast<int64_t>(p.seconds * 1e9));
  const int64_t end = sh.phase_end.back();
  auto phase_of = [&](int64_t when) {
    if (when < measure) return -1;
    for (size_t i = 0; i < sh.phase_end.size(); ++i)
      if (when < sh.phase_end[i]) return static_cast<int>(i);
    return -2;  // past the end
  };
  std::atomic<bool> sending{true};
  // Completion threads: block on their CQ (no spinning), record, and in closed loop re-send.
  std::vector<std::thread> threads;
  for (auto& cq : sh.cqs) {
    threads.emplace_back([&, q = cq.get()] {
      void* tag;
      bool ok;
      while (q->Next(&tag, &ok)) {
        auto* c = static_cast<Call*>(tag);
        const int64_t done = Now();
        sh.Record(c, done);
        delete c;
        if (closed && sending.load()) {
          const int64_t now = Now();
          const int ph = phase_of(now);
          if (ph != -2) sh.Send(now, ph);
        }
        sh.outstanding.fetch_sub(1);
      }
    });
  }
  if (closed) {
    for (int i = 0; i < opt.concurrency; ++i) sh.Send(Now(), phase_of(Now()));
    SleepUntil(end);
    sending = false;
  } else {
    // Wake-ups within ~1 us of the intended time, not the default 50 us timer slack.
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    Arrivals arr(opt.seed);
    int64_t intended = start;
    for (;;) {
      const int ph = phase_of(intended);
      if (ph == -2) break;
      const double qps = phases[static_cast<size_t>(ph < 0 ? 0 : ph)].qps;
      const int64_t now = Now();
      if (intended > now) SleepUntil(intended);  // sleep until the intended time
      else if (now - intended > 1000000) ++out->late_sends;
      if (ph >= 0) out->send_lag.Record(std::max<int64_t>(0, Now() - intended));
      sh.Send(intended, ph);
      intended += arr.NextGapNs(qps);
    }
    sending = false;
  }
  // Drain: every call has a deadline, so this ends.
  const int64_t give_up = Now() + static_cast<int64_t>(opt.timeout_ms + 5000) * 1000000;
  while (sh.outstanding.load() > 0 && Now() < give_up) SleepUntil(Now() + 2000000);
  for (auto& cq : sh.cqs) cq->Shutdown();
  for (auto& th : threads) th.join();
  int64_t prev = measure;
  for (size_t i = 0; i < phases.size(); ++i) {
    auto& p = out->phases[i];
    p.window_s = static_cast<double>(sh.phase_end[i] - prev) / 1e9;
    prev = sh.phase_end[i];
    out->total.ok += p.ok;
    out->total.errors += p.errors;
    out->total.latency.Merge(p.latency);
    for (auto& [k, v] : p.codes) out->total.codes[k] += v;
    for (auto& [k, v] : p.methods) out->total.methods[k] += v;
    out->total.window_s += p.window_s;
  }
  return "";
}

namespace {
void LatencyJson(std::ostringstream& os, const musku::Histogram& h) {
  auto us = [&](double q) { return static_cast<double>(h.Percentile(q)) / 1e3; };
  os << "{\"p50\": " << us(0.5) << ", \"p90\": " << us(0.9) << ", \"p99\": " << us(0.99)
     << ", \"p999\": " << us(0.999) << ", \"max\": " << static_cast<double>(h.Max()) / 1e3
     << ", \"mean\": " << h.Mean() / 1e3 << ", \"buckets\": [";
  // every non-empty bucket as [upper bound in us, count]: runs can be pooled and resampled
  bool first = true;
  for (const auto& [upper_ns, n] : h.Buckets()) {
    os << (first ? "" : ", ") << "[" << static_cast<double>(upper_ns) / 1e3 << ", " << n << "]";
    first = false;
  }
  os << "]}";
}
void PhaseJson(std::ostringstream& os, const PhaseResult& p) {
  const double n = static_cast<double>(p.ok + p.errors);
  os << "{\"target_qps\": " << p.phase.qps << ", \"seconds\": " << p.window_s
     << ", \"ok\": " << p.ok << ", \"errors\": " << p.errors
     << ", \"achieved_qps\": " << (p.window_s > 0 ? static_cast<double>(p.ok) / p.window_s : 0)
     << ", \"error_rate\": " << (n > 0 ? static_cast<double>(p.errors) / n : 0) << ", \"codes\": {";
  bool first = true;
  for (auto& [k, v] : p.codes) {
    os << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
  }
  os << "}";
  if (!p.methods.empty()) {
    os << ", \"methods\": {";
    first = true;
    for (auto& [k, v] : p.methods) {
      os << (first ? "" : ", ") << "\"" << k << "\": " << v;
      first = false;
    }
    os << "}";
  }
  os << ", \"latency_us\": ";
  LatencyJson(os, p.latency);
  os << "}";
}
}  // namespace

std::string ToJson(const Options& opt, const Result& r) {
  std::ostringstream os;
  os.precision(6);
  os << "{\"mode\": \"" << opt.mode << "\", \"target\": \"" << opt.target
     << "\", \"warmup_s\": " << opt.warmup_s << ", \"late_sends\": " << r.late_sends
     << ", \"preloaded\": " << r.preloaded << ", \"warmup_answered\": " << r.warmup_answered
     << ", \"send_lag_us\": ";
  LatencyJson(os, r.send_lag);
  os << ", \"total\": ";
  PhaseJson(os, r.total);
  os << ", \"phases\": [";
  for (size_t i = 0; i < r.phases.size(); ++i) {
    if (i) os << ", ";
    PhaseJson(os, r.phases[i]);
  }
  os << "]}";
  return os.str();
}

}  // namespace loadgen
