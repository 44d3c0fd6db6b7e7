// The event loop (docs/qsim.md "Engine").
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <deque>
#include <limits>
#include <memory>

namespace musku::qsim {

// ------------------------------------------------------------------ random numbers

namespace {
uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

uint64_t DeriveSeed(uint64_t run_seed, uint64_t stream) {
  uint64_t x = run_seed * 0x100000001b3ULL ^ (stream + 0x51afd7ed558ccd1dULL);
  SplitMix(x);
  return SplitMix(x);
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = SplitMix(x);
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

// Exponential variates by Marsaglia and Tsang's ziggurat ("The Ziggurat Method for Generating
// Random Variables", J. Stat. Softw. 5(8), 2000): 256 layers of equal area under e^-x, built
// once below for 53-bit magnitudes. One 64-bit draw gives the layer (low 8 bits) and, apart,
// the magnitude (high 53 bits); 98.9 % of draws return x = magnitude * w[layer] after one
// compare, the rest take the wedge test or the tail (r + Exp(1), memoryless). The same
// distribution as -log(1 - U), about 4x cheaper than log1p; the same seed gives the same values.
namespace {
struct ExpZiggurat {
  uint64_t k[256];  // a magnitude below k[i] is inside layer i's rectangle: accept at once
  double w[256];    // magnitude -> x
  double f[256];    // e^-x at layer i's right edge
  static constexpr double kR = 7.697117470131487;     // the base layer's right edge
  static constexpr double kV = 3.949659822581572e-3;  // each layer's area
  ExpZiggurat() {
    const double m = 9007199254740992.0;  // 2^53
    double de = kR, te = kR;
    const double q = kV / std::exp(-de);
    k[0] = static_cast<uint64_t>((de / q) * m);
    k[1] = 0;
    w[0] = q / m;
    w[255] = de / m;
    f[0] = 1.0;
    f[255] = std::exp(-de);
    for (int i = 254; i >= 1; --i) {
      de = -std::log(kV / de + std::exp(-de));
      k[i + 1] = static_cast<uint64_t>((de / te) * m);
      te = de;
      f[i] = std::exp(-de);
      w[i] = de / m;
    }
  }
};
const ExpZiggurat kExpZig;
}  // namespace

double Rng::Exp(double mean) {
  for (;;) {
    const uint64_t r = Next();
    const unsigned i = static_cast<unsigned>(r & 0xff);
    const uint64_t mag = r >> 11;
    const double x = static_cast<double>(mag) * kExpZig.w[i];
    if (mag < kExpZig.k[i]) return mean * x;
    if (i == 0) return mean * (ExpZiggurat::kR - std::log1p(-Uniform()));  // the tail
    if (kExpZig.f[i] + Uniform() * (kExpZig.f[i - 1] - kExpZig.f[i]) < std::exp(-x)) return mean * x;
  }
}

double Rng::Normal() {  // Box-Muller, one value per call (simple; reproducible)
  const double u1 = 1.0 - Uniform(), u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// ------------------------------------------------------------------ histogram

namespace {
constexpr int kSubBits = Hist::kSubBits;
constexpr int kSub = 1 << kSubBits;
constexpr int kHalf = kSub / 2;
constexpr int64_t kMaxValue = Hist::kMaxValue;
constexpr int IndexOf(int64_t v) { return Hist::Index(v); }
inline int64_t UpperBound(int index) {
  if (index < kSub) return index;
  const int shift = index / kHalf - 1;
  const int64_t mant = index % kHalf + kHalf;
  return ((mant + 1) << shift) - 1;
}
inline int64_t Midpoint(int index) {
  if (index < kSub) return index;
  const int shift = index / kHalf - 1;
  const int64_t mant = index % kHalf + kHalf;
  return (mant << shift) + ((int64_t{1} << shift) >> 1);
}
static_assert(((IndexOf(kMaxValue) >> (kSubBits - 1)) + 1) == Hist::kSegments, "Hist::kSegments");
}  // namespace

Hist& Hist::operator=(const Hist& o) {
  if (this == &o) return *this;
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    if (o.seg_[s]) {
      seg_[s].reset(new uint64_t[kHalf]);
      std::copy(o.seg_[s].get(), o.seg_[s].get() + kHalf, seg_[s].get());
    } else {
      seg_[s].reset();
    }
  }
  count_ = o.count_;
  sum_ = o.sum_;
  max_ = o.max_;
  return *this;
}

uint64_t* Hist::Segment(size_t s) {
  if (!seg_[s]) seg_[s].reset(new uint64_t[kHalf]());
  return seg_[s].get();
}

void Hist::Merge(const Hist& o) {
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    if (!o.seg_[s]) continue;
    uint64_t* seg = Segment(s);
    for (int k = 0; k < kHalf; ++k) seg[k] += o.seg_[s][k];
  }
  count_ += o.count_;
  sum_ += o.sum_;
  max_ = std::max(max_, o.max_);
}

int64_t Hist::Percentile(double q) const {
  if (count_ == 0) return 0;
  const double target = std::max(1.0, std::ceil(q * static_cast<double>(count_)));
  uint64_t seen = 0;
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    const uint64_t* seg = seg_[s].get();
    if (!seg) continue;
    for (int k = 0; k < kHalf; ++k) {
      seen += seg[k];
      if (seg[k] > 0 && static_cast<double>(seen) >= target)
        return std::min(Midpoint(static_cast<int>((s << (kSubBits - 1)) + static_cast<size_t>(k))), max_);
    }
  }
  return max_;
}

nlohmann::json Hist::Buckets() const {
  nlohmann::json out = nlohmann::json::array();
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    if (!seg_[s]) continue;
    for (int k = 0; k < kHalf; ++k)
      if (seg_[s][k] > 0)
        out.push_back({static_cast<double>(UpperBound(static_cast<int>((s << (kSubBits - 1)) + static_cast<size_t>(k)))) / 1000.0,
                       seg_[s][k]});
  }
  return out;
}

nlohmann::json Hist::Summary() const {
  auto us = [](int64_t ns) { return static_cast<double>(ns) / 1000.0; };
  return {{"count", count_},          {"mean_us", Mean() / 1000.0},
          {"p50_us", us(Percentile(0.5))}, {"p90_us", us(Percentile(0.9))},
          {"p99_us", us(Percentile(0.99))}, {"p999_us", us(Percentile(0.999))},
          {"max_us", us(max_)}};
}

void BatchHists::Record(double frac, int64_t v) {
  const double n = static_cast<double>(h_.size());
  size_t b = static_cast<size_t>(std::max(0.0, std::min(n - 1, std::floor(frac * n))));
  h_[b].Record(v);
}

nlohmann::json BatchHists::Intervals(const Hist& all) const {
  // t(0.975, n-1) for the batch counts used here; larger n: the normal quantile
  static const double kT[] = {0, 0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262,
                              2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093};
  const size_t n = h_.size();
  nlohmann::json out = nlohmann::json::object();
  out["batches"] = n;
  if (n < 2) return out;
  const double t = n < sizeof(kT) / sizeof(kT[0]) ? kT[n] : 1.96;
  {  // the mean: the batches' means (each batch at least 20 values)
    double sum = 0, sum2 = 0;
    bool enough = true;
    for (const Hist& h : h_) {
      if (h.Count() < 20) {
        enough = false;
        break;
      }
      const double x = h.Mean() / 1000.0;
      sum += x;
      sum2 += x * x;
    }
    if (enough) {
      const double nn = static_cast<double>(n);
      const double mean = sum / nn;
      const double sd = std::sqrt(std::max(0.0, (sum2 - nn * mean * mean) / (nn - 1)));
      const double centre = all.Mean() / 1000.0;
      out["mean_us"] = {centre - t * sd / std::sqrt(nn), centre + t * sd / std::sqrt(nn)};
    }
  }
  for (const auto& [key, q] : {std::pair<const char*, double>{"p50_us", 0.5}, {"p90_us", 0.9}, {"p99_us", 0.99}}) {
    double sum = 0, sum2 = 0;
    bool enough = true;
    for (const Hist& h : h_) {
      if (static_cast<double>(h.Count()) * (1 - q) < 20) {
        enough = false;
        break;
      }
      const double x = static_cast<double>(h.Percentile(q)) / 1000.0;
      sum += x;
      sum2 += x * x;
    }
    if (!enough) continue;
    const double nn = static_cast<double>(n);
    const double mean = sum / nn;
    const double sd = std::sqrt(std::max(0.0, (sum2 - nn * mean * mean) / (nn - 1)));
    const double centre = static_cast<double>(all.Percentile(q)) / 1000.0;
    const double half = t * sd / std::sqrt(nn);
    out[key] = {centre - half, centre + half};
  }
  return out;
}

// ------------------------------------------------------------------ simulator

namespace {

struct Request {
  double start = 0;
  int path = 0;
  int64_t tokens = 0;  // live jobs and in-flight arrivals of this request
  int conn = 0;
  int user = -1;
  bool measured = false;
  double done = 0;  // latest time one of its tree's leaves finished
  std::vector<int> join_count;
  std::vector<double> join_time;
  std::vector<int> join_inst;
  std::vector<int> sticky;  // per service: the instance this request used (-1 = none yet)
  std::vector<int> held;    // per service: the thread held for this request (-1 = none)
};

struct Job {
  Request* req = nullptr;
  int node = 0;
  int pos = 0;   // index into the node's stage list
  int inst = 0;  // global instance index
  int conn = 0;
  int copy = -1;  // instance offset inherited from a fan-out (copies) ancestor, -1 = none
  double node_arrival = 0;
  bool pooled = false;  // holds one of its node's pool connections
  Job* next = nullptr;  // the next job on the same connection sub-queue (ConnQ)
  const NodeSpec* spec = nullptr;  // paths[req->path].nodes[node], kept to save the loads
};

// A connection's sub-queue of an epoll/socket stage: an intrusive FIFO through Job::next (two
// pointers per connection, no allocation; a std::deque per connection cost a cache miss or two
// per job on the 100-connection 2-tier model).
struct ConnQ {
  Job* head = nullptr;
  Job* tail = nullptr;
  bool empty() const { return head == nullptr; }
  void push_back(Job* j) {
    j->next = nullptr;
    if (tail != nullptr) tail->next = j;
    else head = j;
    tail = j;
  }
  Job* front() const { return head; }
  void pop_front() {
    head = head->next;
    if (head == nullptr) tail = nullptr;
  }
};

// A node's pool of blocking (http/1.1-style) connections: one call per connection at a time.
struct PoolRt {
  int busy = 0;
  std::deque<Job*> waiting;  // calls waiting for a connection, first come first served
};

// FIFO on a power-of-two ring (no per-node allocation, unlike std::deque's chunks).
template <typename T>
class Ring {
 public:
  bool empty() const { return head_ == tail_; }
  size_t size() const { return tail_ - head_; }
  void push_back(T j) {
    if (tail_ - head_ == buf_.size()) Grow();
    buf_[tail_++ & (buf_.size() - 1)] = j;
  }
  T front() const { return buf_[head_ & (buf_.size() - 1)]; }
  void pop_front() { ++head_; }

 private:
  void Grow() {
    std::vector<T> nb(buf_.empty() ? 4 : buf_.size() * 2);
    for (size_t i = head_; i < tail_; ++i) nb[i - head_] = buf_[i & (buf_.size() - 1)];
    tail_ -= head_;
    head_ = 0;
    buf_.swap(nb);
  }
  std::vector<T> buf_;
  size_t head_ = 0, tail_ = 0;
};

struct StageQ {
  QueueKind kind = QueueKind::kFifo;
  Ring<Job*> fifo;
  std::vector<ConnQ> conns;
  Ring<int> ready;  // connections with queued jobs, each once
  size_t len = 0, max_len = 0;
  double area = 0, last = 0;
};

struct Core {
  bool busy = false;
  int last_thread = -1;
  double busy_time = 0;
};

struct Thread {
  int inst = 0;
  int index = 0;  // within the instance
  int core = -1;
  bool waking = false;
  bool held = false;
  bool idle = true;
  Job* private_job = nullptr;
  std::vector<Job*> batch;
  int batch_stage = 0;
  double start = 0;
  double busy_time = 0;
};

struct Instance {
  int service = 0;
  int machine = 0;
  std::vector<int> cores;
  std::vector<StageQ> queues;
  std::vector<int> idle;  // thread ids
  int first_thread = 0;
  size_t pending = 0;      // queued jobs
  int waking = 0;          // threads woken but not yet running
  size_t outstanding = 0;  // jobs queued or in service (least-loaded)
  bool defer_wake = false; // a batching stage: a woken thread starts after this instant's events
  bool lindley = false;    // one FIFO server: departures computed on arrival (Sim::Lindley)
  double free_at = 0;
};

struct MachineRt {
  std::vector<Core> cores;
  std::deque<int> runq;  // runnable threads waiting for a core
};

enum EvType : uint8_t { kArrival, kUser, kJobArrive, kCopies, kDone, kWarmup, kWake, kControl };

struct Event {
  double t;
  uint64_t key;  // insertion sequence << 8 | type: ties at the same instant run in FIFO order
  void* p;
  int a;
  int b;
  EvType type() const { return static_cast<EvType>(key & 0xff); }
};

inline bool Before(const Event& x, const Event& y) { return x.t < y.t || (x.t == y.t && x.key < y.key); }

// A 4-ary min-heap on (time, sequence): half the depth of a binary heap, children contiguous.
class EventHeap {
 public:
  bool empty() const { return v_.empty(); }
  size_t size() const { return v_.size(); }
  void push(const Event& e) {
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!Before(e, v_[parent])) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = e;
  }
  Event pop() {
    const Event top = v_[0];
    const Event last = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n == 0) return top;
    size_t i = 0;
    for (;;) {
      const size_t c = 4 * i + 1;
      if (c >= n) break;
      size_t best = c;
      const size_t end = std::min(c + 4, n);
      for (size_t k = c + 1; k < end; ++k)
        if (Before(v_[k], v_[best])) best = k;
      if (!Before(v_[best], last)) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = last;
    return top;
  }

 private:
  std::vector<Event> v_;
};

// Objects allocated in chunks of 1024 (locality), recycled LIFO (hot in cache).
template <typename T>
class Pool {
 public:
  T* Get() {
    if (free_.empty()) {
      if (used_ == kChunk || chunks_.empty()) {
        chunks_.push_back(std::make_unique<T[]>(kChunk));
        used_ = 0;
      }
      ++allocated_;
      return &chunks_.back()[used_++];
    }
    T* p = free_.back();
    free_.pop_back();
    return p;
  }
  void Put(T* p) { free_.push_back(p); }
  size_t Allocated() const { return allocated_; }

 private:
  static constexpr size_t kChunk = 1024;
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::vector<T*> free_;
  size_t used_ = 0, allocated_ = 0;
};

// The process's peak resident set (VmHWM, KiB; 0 where /proc is missing). Unlike a parent's
// getrusage(RUSAGE_CHILDREN) it does not carry the parent's size over fork and exec.
long PeakRssKib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  std::fclose(f);
  return kib;
}

class Sim {
 public:
  explicit Sim(const Model& m, const Controller* control = nullptr) : m_(m), control_(control) {}
  nlohmann::json Run();

 private:
  // streams
  enum : uint64_t { kStreamArrival = 1, kStreamPath = 2, kStreamLb = 3, kStreamBranch = 4, kStreamConn = 5, kStreamStage = 1000 };

  void Push(double t, EvType type, int a = 0, int b = 0, void* p = nullptr) {
    heap_.push(Event{t, (seq_++ << 8) | type, p, a, b});
  }
  double Latency(int from_machine, int to_machine) const {
    if (from_machine < 0) return m_.client_latency_us * 1000.0;
    return (from_machine == to_machine ? m_.local_latency_us : m_.net_latency_us) * 1000.0;
  }
  int Route(Request* r, int service);
  void NewRequest(int user);
  void Spawn(Request* r, int node, int from_machine, double now, int copy);
  void Enqueue(Job* j);
  void QueueChange(StageQ& q, long delta) {
    q.area += static_cast<double>(q.len) * (now_ - std::max(q.last, measure_start_));
    q.last = now_;
    q.len = static_cast<size_t>(static_cast<long>(q.len) + delta);
    if (q.len > q.max_len) q.max_len = q.len;
  }
  void Wake(Instance& in);
  void MakeRunnable(int tid);
  void Grant(int tid, int core);
  void StartWork(int tid);
  void Done(int tid);
  void ReleaseCore(int tid);
  void FinishNode(Job* j, double t);
  void Complete(Request* r);
  bool Lindley(Job* j, Instance& in);
  double ServiceTime(const StageSpec& st, const ServiceSpec& sv, size_t n, Rng& rng);
  void Stop(const std::string& why, bool saturated) {
    if (!stopped_) {
      stopped_ = true;
      stop_reason_ = why;
      saturated_ = saturated;
    }
  }

  void Control();  // a controller's interval (Simulate with a Controller)
  void Progress();  // a progress line on stderr when its wall-clock interval has passed

  // events between two looks at the wall clock for progress (a mask: one AND per event)
  static constexpr uint64_t kProgressMask = (uint64_t{1} << 16) - 1;
  std::chrono::steady_clock::time_point progress_next_{};

  const Model& m_;
  const Controller* control_;
  std::vector<double> freq_ratio_;  // per service: f_base / f now (the controller may change it)
  Hist win_e2e_;                    // the controller's interval
  std::vector<Hist> win_svc_;
  std::vector<double> win_busy_mark_;  // per thread: busy_time at the interval's start
  std::vector<PoolRt> pools_;
  EventHeap heap_;
  uint64_t seq_ = 0;
  double now_ = 0, end_ = 0, warmup_ = 0, measure_start_ = 0;
  bool stopped_ = false, saturated_ = false;
  std::string stop_reason_;
  Rng rng_arrival_, rng_path_, rng_lb_, rng_branch_, rng_conn_;
  std::vector<std::vector<Rng>> rng_stage_;  // [service][stage]
  std::vector<std::vector<double>> svc_freq_factor_;
  std::vector<MachineRt> machines_;
  std::vector<Instance> inst_;
  std::vector<int> svc_first_inst_;
  std::vector<size_t> svc_rr_;
  std::vector<Thread> threads_;
  Pool<Request> req_pool_;
  Pool<Job> job_pool_;
  std::vector<double> path_cdf_;
  uint64_t live_requests_ = 0, live_jobs_ = 0, events_ = 0, stage_runs_ = 0, jobs_run_ = 0;
  uint64_t issued_ = 0, completed_ = 0, completed_measured_ = 0, issued_measured_ = 0;
  int epoch_ = 0;
  Hist e2e_;
  BatchHists batches_;
  std::vector<Hist> svc_hist_;
  // Overload: the requests in the system (issued, not yet answered) at the start of the
  // measured window, half-way and at its end. A request a Lindley instance answers is counted
  // by the time it is answered, not by when the engine computed that time.
  double sample_t_[3] = {0, 0, 0};
  uint64_t issued_by_[3] = {0, 0, 0}, done_by_[3] = {0, 0, 0};
  bool mid_seen_ = false;
};

int Sim::Route(Request* r, int service) {
  const ServiceSpec& sv = m_.services[static_cast<size_t>(service)];
  const int base = svc_first_inst_[static_cast<size_t>(service)];
  const int n = static_cast<int>(sv.instances.size());
  if (n == 1) return base;
  switch (sv.lb) {
    case Lb::kRoundRobin:
      return base + static_cast<int>(svc_rr_[static_cast<size_t>(service)]++ % static_cast<size_t>(n));
    case Lb::kRandom:
      return base + static_cast<int>(rng_lb_.Next() % static_cast<uint64_t>(n));
    case Lb::kConnection:  // a connection is bound to one instance (μqSim's bind_connection)
      return base + r->conn % n;
    case Lb::kLeastLoaded: {
      int best = base;
      for (int i = 1; i < n; ++i)
        if (inst_[static_cast<size_t>(base + i)].outstanding < inst_[static_cast<size_t>(best)].outstanding)
          best = base + i;
      return best;
    }
  }
  return base;
}

void Sim::NewRequest(int user) {
  if (live_requests_ >= m_.max_live_requests) {
    Stop("more than " + std::to_string(m_.max_live_requests) + " requests in flight", true);
    return;
  }
  Request* r = req_pool_.Get();
  int p = 0;
  if (path_cdf_.size() > 1) {
    const double u = rng_path_.Uniform();
    while (p + 1 < static_cast<int>(path_cdf_.size()) && u >= path_cdf_[static_cast<size_t>(p)]) ++p;
  }
  const PathSpec& ps = m_.paths[static_cast<size_t>(p)];
  r->start = now_;
  r->path = p;
  r->tokens = 0;
  r->user = user;
  // an open-loop request picks a client connection at random (closed loop: the user's own)
  r->conn = user >= 0 ? user % m_.client.connections
                      : static_cast<int>(rng_conn_.Next() % static_cast<uint64_t>(m_.client.connections));
  r->measured = now_ >= warmup_;
  r->done = now_;
  r->join_count.assign(static_cast<size_t>(ps.join_slots), 0);
  r->join_time.assign(static_cast<size_t>(ps.join_slots), 0.0);
  r->join_inst.assign(static_cast<size_t>(ps.join_slots), -1);
  r->sticky.assign(m_.services.size(), -1);
  r->held.assign(m_.services.size(), -1);
  ++live_requests_;
  ++issued_;
  if (r->measured) ++issued_measured_;
  Spawn(r, ps.root, -1, now_, -1);
}

void Sim::Spawn(Request* r, int node, int from_machine, double now, int copy) {
  const NodeSpec& n = m_.paths[static_cast<size_t>(r->path)].nodes[static_cast<size_t>(node)];
  if (n.join > 1) {
    const size_t slot = static_cast<size_t>(n.join_slot);
    if (r->join_inst[slot] < 0) {
      const int sticky = r->sticky[static_cast<size_t>(n.service)];
      r->join_inst[slot] = sticky >= 0 ? sticky : Route(r, n.service);
    }
    const int inst = r->join_inst[slot];
    const double t = now + Latency(from_machine, inst_[static_cast<size_t>(inst)].machine);
    r->join_time[slot] = std::max(r->join_time[slot], t);
    if (++r->join_count[slot] < n.join) return;
    Job* j = job_pool_.Get();
    *j = Job{r, node, 0, inst, r->conn, -1, 0};
    j->spec = &n;
    r->sticky[static_cast<size_t>(n.service)] = inst;
    ++r->tokens;
    ++live_jobs_;
    Push(r->join_time[slot], kJobArrive, 0, 0, j);
    return;
  }
  if (n.copies > 1) {
    const int base = svc_first_inst_[static_cast<size_t>(n.service)];
    const int ninst = static_cast<int>(m_.services[static_cast<size_t>(n.service)].instances.size());
    const int first = Route(r, n.service) - base;
    r->tokens += n.copies;
    live_jobs_ += static_cast<uint64_t>(n.copies);
    const double t = now + Latency(from_machine, inst_[static_cast<size_t>(base + first % ninst)].machine);
    Push(t, kCopies, node, first, r);
    return;
  }
  int inst;
  if (copy >= 0) {  // follows its fan-out copy: the instance at the same offset
    const int ninst = static_cast<int>(m_.services[static_cast<size_t>(n.service)].instances.size());
    inst = svc_first_inst_[static_cast<size_t>(n.service)] + copy % ninst;
  } else {
    const int sticky = r->sticky[static_cast<size_t>(n.service)];
    inst = (sticky >= 0) ? sticky : Route(r, n.service);
    r->sticky[static_cast<size_t>(n.service)] = inst;
  }
  Job* j = job_pool_.Get();
  *j = Job{r, node, 0, inst, r->conn, copy, 0};
  j->spec = &n;
  ++r->tokens;
  ++live_jobs_;
  const double lat = Latency(from_machine, inst_[static_cast<size_t>(inst)].machine);
  if (lat == 0 && now == now_) {
    Enqueue(j);  // same instant: no event needed
  } else {
    Push(now + lat, kJobArrive, 0, 0, j);
  }
}

void Sim::Enqueue(Job* j) {
  Request* r = j->req;
  const NodeSpec& n = *j->spec;
  Instance& in = inst_[static_cast<size_t>(j->inst)];
  if (j->pos == 0 && !j->pooled) j->node_arrival = now_;
  if (j->pos == 0 && n.pool > 0 && !j->pooled) {  // a call needs a free connection
    PoolRt& p = pools_[static_cast<size_t>(n.pool_slot)];
    if (p.busy >= n.pool) {
      p.waiting.push_back(j);
      return;
    }
    ++p.busy;
    j->pooled = true;
  }
  if (j->pos == 0 && n.release_thread && r->held[static_cast<size_t>(n.service)] >= 0) {
    const int tid = r->held[static_cast<size_t>(n.service)];
    r->held[static_cast<size_t>(n.service)] = -1;
    Thread& t = threads_[static_cast<size_t>(tid)];
    t.held = false;
    t.private_job = j;
    ++in.outstanding;
    MakeRunnable(tid);
    return;
  }
  if (in.lindley) {
    Lindley(j, in);
    return;
  }
  StageQ& q = in.queues[static_cast<size_t>(n.stages[static_cast<size_t>(j->pos)])];
  QueueChange(q, +1);
  if (q.kind == QueueKind::kFifo) {
    q.fifo.push_back(j);
  } else {
    // the request's client connection, modulo this service's connection count (a service
    // with fewer connections than the client has: indexing by j->conn alone overran conns)
    const int c = j->conn % static_cast<int>(q.conns.size());
    auto& cq = q.conns[static_cast<size_t>(c)];
    if (cq.empty()) q.ready.push_back(c);
    cq.push_back(j);
  }
  ++in.pending;
  ++in.outstanding;
  Wake(in);
}

void Sim::Wake(Instance& in) {
  while (in.pending > static_cast<size_t>(in.waking) && !in.idle.empty()) {
    const int tid = in.idle.back();
    in.idle.pop_back();
    Thread& t = threads_[static_cast<size_t>(tid)];
    t.idle = false;
    t.waking = true;
    ++in.waking;
    if (in.defer_wake) Push(now_, kWake, tid);
    else MakeRunnable(tid);
  }
}

void Sim::MakeRunnable(int tid) {
  Thread& t = threads_[static_cast<size_t>(tid)];
  const Instance& in = inst_[static_cast<size_t>(t.inst)];
  const ServiceSpec& sv = m_.services[static_cast<size_t>(in.service)];
  if (sv.simple) {
    StartWork(tid);
    return;
  }
  MachineRt& mc = machines_[static_cast<size_t>(in.machine)];
  if (sv.pinned) {
    const int c = in.cores[static_cast<size_t>(t.index) % in.cores.size()];
    if (!mc.cores[static_cast<size_t>(c)].busy) {
      Grant(tid, c);
      return;
    }
  } else {
    for (int c : in.cores) {
      if (!mc.cores[static_cast<size_t>(c)].busy) {
        Grant(tid, c);
        return;
      }
    }
  }
  mc.runq.push_back(tid);
}

void Sim::Grant(int tid, int core) {
  Thread& t = threads_[static_cast<size_t>(tid)];
  const Instance& in = inst_[static_cast<size_t>(t.inst)];
  machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(core)].busy = true;
  t.core = core;
  StartWork(tid);
}

double Sim::ServiceTime(const StageSpec& st, const ServiceSpec& sv, size_t n, Rng& rng) {
  double mean = st.mean_us + st.per_job_us * static_cast<double>(n - 1);
  int repeat = 1;
  if (!st.table_bytes.empty()) {
    const double bytes = st.bytes_per_job * static_cast<double>(n);
    size_t i = 0;
    while (i < st.table_bytes.size() && st.table_bytes[i] < bytes) ++i;
    if (i == st.table_bytes.size()) {
      --i;
      repeat = std::max(1, static_cast<int>(bytes / st.table_bytes[i]));
    }
    mean = st.table_us[i];
  }
  double total = 0;
  for (int k = 0; k < repeat; ++k) {
    switch (st.dist) {
      case Dist::kExp: total += rng.Exp(mean); break;
      case Dist::kConst: total += mean; break;
      case Dist::kLognormal: {
        if (mean <= 0) break;
        const double mu = std::log(mean) - st.sigma * st.sigma / 2;
        total += std::exp(mu + st.sigma * rng.Normal());
        break;
      }
      case Dist::kEmpirical: {
        const double u = rng.Uniform();
        const size_t i = static_cast<size_t>(
            std::lower_bound(st.emp_cdf.begin(), st.emp_cdf.end(), u) - st.emp_cdf.begin());
        const double v = st.emp_values_us[std::min(i, st.emp_values_us.size() - 1)];
        total += st.emp_mean_us > 0 ? v * mean / st.emp_mean_us : v;
        break;
      }
    }
  }
  if (st.dvfs_scale > 0)
    total *= 1.0 - st.dvfs_scale + st.dvfs_scale * freq_ratio_[static_cast<size_t>(&sv - m_.services.data())];
  return total * sv.time_scale * 1000.0;  // ns
}

void Sim::StartWork(int tid) {
  Thread& t = threads_[static_cast<size_t>(tid)];
  Instance& in = inst_[static_cast<size_t>(t.inst)];
  const ServiceSpec& sv = m_.services[static_cast<size_t>(in.service)];
  if (t.waking) {
    t.waking = false;
    --in.waking;
  }
  t.batch.clear();
  if (t.private_job != nullptr) {
    Job* j = t.private_job;
    t.private_job = nullptr;
    const NodeSpec& n = *j->spec;
    t.batch_stage = n.stages[static_cast<size_t>(j->pos)];
    t.batch.push_back(j);
  } else {
    int s = static_cast<int>(in.queues.size()) - 1;  // later stages first: drain work in progress
    while (s >= 0 && in.queues[static_cast<size_t>(s)].len == 0) --s;
    if (s < 0) {  // nothing to do (another thread took it)
      if (t.core >= 0) ReleaseCore(tid);
      t.idle = true;
      in.idle.push_back(tid);
      return;
    }
    StageQ& q = in.queues[static_cast<size_t>(s)];
    const size_t limit = static_cast<size_t>(sv.stages[static_cast<size_t>(s)].batch);
    t.batch_stage = s;
    if (q.kind == QueueKind::kFifo) {
      while (!q.fifo.empty() && t.batch.size() < limit) {
        t.batch.push_back(q.fifo.front());
        q.fifo.pop_front();
      }
    } else {
      const size_t nready = q.kind == QueueKind::kEpoll ? q.ready.size() : 1;
      for (size_t r = 0; r < nready && !q.ready.empty(); ++r) {
        const int c = q.ready.front();
        q.ready.pop_front();
        auto& cq = q.conns[static_cast<size_t>(c)];
        for (size_t k = 0; k < limit && !cq.empty(); ++k) {
          t.batch.push_back(cq.front());
          cq.pop_front();
        }
        if (!cq.empty()) q.ready.push_back(c);
      }
    }
    QueueChange(q, -static_cast<long>(t.batch.size()));
    in.pending -= t.batch.size();
  }
  const StageSpec& st = sv.stages[static_cast<size_t>(t.batch_stage)];
  double d = ServiceTime(st, sv, t.batch.size(),
                         rng_stage_[static_cast<size_t>(in.service)][static_cast<size_t>(t.batch_stage)]);
  if (t.core >= 0) {
    Core& c = machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(t.core)];
    if (c.last_thread != tid && c.last_thread != -1) d += sv.context_switch_us * 1000.0;
    c.last_thread = tid;
  }
  t.start = now_;
  ++stage_runs_;
  jobs_run_ += t.batch.size();
  Push(now_ + d, kDone, tid);
}

void Sim::ReleaseCore(int tid) {
  Thread& t = threads_[static_cast<size_t>(tid)];
  const Instance& in = inst_[static_cast<size_t>(t.inst)];
  MachineRt& mc = machines_[static_cast<size_t>(in.machine)];
  const int core = t.core;
  mc.cores[static_cast<size_t>(core)].busy = false;
  t.core = -1;
  for (auto it = mc.runq.begin(); it != mc.runq.end(); ++it) {
    const Thread& w = threads_[static_cast<size_t>(*it)];
    const Instance& wi = inst_[static_cast<size_t>(w.inst)];
    const ServiceSpec& wsv = m_.services[static_cast<size_t>(wi.service)];
    bool ok;
    if (wsv.pinned) ok = wi.cores[static_cast<size_t>(w.index) % wi.cores.size()] == core;
    else ok = std::find(wi.cores.begin(), wi.cores.end(), core) != wi.cores.end();
    if (ok) {
      const int wid = *it;
      mc.runq.erase(it);
      Grant(wid, core);
      return;
    }
  }
}

void Sim::Done(int tid) {
  Thread& t = threads_[static_cast<size_t>(tid)];
  Instance& in = inst_[static_cast<size_t>(t.inst)];
  const double busy = now_ - std::max(t.start, measure_start_);
  if (busy > 0) {
    t.busy_time += busy;
    if (t.core >= 0) machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(t.core)].busy_time += busy;
  }
  bool hold = false;
  for (Job* j : t.batch) {
    const NodeSpec& n = *j->spec;
    ++j->pos;
    --in.outstanding;
    if (j->pos < static_cast<int>(n.stages.size())) {
      Enqueue(j);
    } else {
      if (n.hold_thread && t.batch.size() == 1 && !n.children.empty()) {
        hold = true;
        j->req->held[static_cast<size_t>(n.service)] = tid;
      }
      FinishNode(j, now_);
    }
  }
  t.batch.clear();
  if (hold) {
    t.held = true;
    if (t.core >= 0) ReleaseCore(tid);
    // A held thread may already have been released (zero network latency and an instant reply
    // are impossible: the release arrives through an event), so nothing else to do here.
    return;
  }
  const ServiceSpec& sv = m_.services[static_cast<size_t>(in.service)];
  if (in.pending > static_cast<size_t>(in.waking)) {
    if (t.core < 0) {  // simple execution: keep going
      StartWork(tid);
      return;
    }
    MachineRt& mc = machines_[static_cast<size_t>(in.machine)];
    bool someone_waits = false;
    for (int w : mc.runq) {
      const Thread& wt = threads_[static_cast<size_t>(w)];
      const Instance& wi = inst_[static_cast<size_t>(wt.inst)];
      if (m_.services[static_cast<size_t>(wi.service)].pinned
              ? wi.cores[static_cast<size_t>(wt.index) % wi.cores.size()] == t.core
              : std::find(wi.cores.begin(), wi.cores.end(), t.core) != wi.cores.end()) {
        someone_waits = true;
        break;
      }
    }
    if (!someone_waits) {
      StartWork(tid);
      return;
    }
    ReleaseCore(tid);
    mc.runq.push_back(tid);  // yield: back of the run queue with its work
    return;
  }
  (void)sv;
  if (t.core >= 0) ReleaseCore(tid);
  t.idle = true;
  in.idle.push_back(tid);
}

// A node finished at time t (now, or later for a Lindley instance, see below).
void Sim::FinishNode(Job* j, double t) {
  Request* r = j->req;
  const NodeSpec& n = *j->spec;
  if (r->measured) svc_hist_[static_cast<size_t>(n.service)].Record(static_cast<int64_t>(t - j->node_arrival));
  if (!win_svc_.empty()) win_svc_[static_cast<size_t>(n.service)].Record(static_cast<int64_t>(t - j->node_arrival));
  if (j->pooled) {  // the reply is back: the connection takes the next waiting call
    j->pooled = false;
    PoolRt& p = pools_[static_cast<size_t>(n.pool_slot)];
    --p.busy;
    if (!p.waiting.empty()) {
      Job* w = p.waiting.front();
      p.waiting.pop_front();
      ++p.busy;
      w->pooled = true;
      Enqueue(w);
    }
  }
  const int machine = inst_[static_cast<size_t>(j->inst)].machine;
  if (!n.children.empty()) {
    if (n.branch == Branch::kAll) {
      for (int c : n.children) Spawn(r, c, machine, t, j->copy);
    } else {
      const double u = rng_branch_.Uniform();
      size_t k = 0;
      while (k + 1 < n.child_cdf.size() && u >= n.child_cdf[k]) ++k;
      Spawn(r, n.children[k], machine, t, j->copy);
    }
  } else {
    r->done = std::max(r->done, t);  // a leaf of the tree: it answers the client
  }
  job_pool_.Put(j);
  --live_jobs_;
  if (--r->tokens == 0) Complete(r);
}

// The fast path for an instance that is one FIFO server (simple execution, one thread, every
// stage fifo with batch 1, every node on it one stage): the job's departure is known when it
// arrives (Lindley's recursion, d = max(a, d_prev) + s), so it needs no event of its own.
// Arrivals reach an instance in time order, so this is exact; the queue-length figures of such
// an instance come from Little's law (waiting time / window).
bool Sim::Lindley(Job* j, Instance& in) {
  const ServiceSpec& sv = m_.services[static_cast<size_t>(in.service)];
  const NodeSpec& n = *j->spec;
  const int stage = n.stages[0];
  const double start = std::max(now_, in.free_at);
  const double d = ServiceTime(sv.stages[static_cast<size_t>(stage)], sv, 1,
                               rng_stage_[static_cast<size_t>(in.service)][static_cast<size_t>(stage)]);
  const double dep = start + d;
  in.free_at = dep;
  // the backlog is in free_at, not in live requests: bound it the same way
  const double mean_ns = std::max(1.0, sv.stages[static_cast<size_t>(stage)].mean_us * 1000.0);
  const double backlog = (start - now_) / mean_ns;
  if (backlog > static_cast<double>(m_.max_live_requests))
    Stop("a backlog of more than " + std::to_string(m_.max_live_requests) + " jobs at " + sv.name, true);
  const double b = std::min(dep, end_) - std::max(start, measure_start_);
  if (b > 0) threads_[static_cast<size_t>(in.first_thread)].busy_time += b;
  StageQ& q = in.queues[static_cast<size_t>(stage)];
  if (now_ >= measure_start_) {
    q.area += start - now_;
    if (start > now_ && q.max_len == 0) q.max_len = 1;
  }
  ++stage_runs_;
  ++jobs_run_;
  FinishNode(j, dep);
  return true;
}

void Sim::Complete(Request* r) {
  const double t = r->done + m_.reply_latency_us * 1000.0;
  if (r->measured && r->done <= end_) {
    e2e_.Record(static_cast<int64_t>(t - r->start));
    batches_.Record((r->start - measure_start_) / std::max(1.0, end_ - measure_start_), static_cast<int64_t>(t - r->start));
    ++completed_measured_;
  }
  if (!win_svc_.empty()) win_e2e_.Record(static_cast<int64_t>(t - r->start));
  for (int k = 0; k < 3; ++k)
    if (t <= sample_t_[k]) ++done_by_[k];
  ++completed_;
  --live_requests_;
  const int user = r->user;
  req_pool_.Put(r);
  if (m_.max_requests > 0 && completed_ >= m_.max_requests) Stop("max_requests reached", false);
  if (user >= 0) {
    const double think = m_.client.think_us > 0 ? rng_arrival_.Exp(m_.client.think_us * 1000.0) : 0.0;
    Push(t + think, kUser, user);
  }
}

nlohmann::json Sim::Run() {
  end_ = m_.duration_s * 1e9;
  warmup_ = m_.warmup_s * 1e9;
  measure_start_ = 0;
  sample_t_[0] = warmup_;
  sample_t_[1] = warmup_ + (end_ - warmup_) / 2;
  sample_t_[2] = end_;
  rng_arrival_ = Rng(DeriveSeed(m_.seed, kStreamArrival));
  rng_path_ = Rng(DeriveSeed(m_.seed, kStreamPath));
  rng_lb_ = Rng(DeriveSeed(m_.seed, kStreamLb));
  rng_branch_ = Rng(DeriveSeed(m_.seed, kStreamBranch));
  rng_conn_ = Rng(DeriveSeed(m_.seed, kStreamConn));
  for (const ServiceSpec& sv : m_.services) freq_ratio_.push_back(sv.freq_ratio);
  double total = 0;
  for (const PathSpec& p : m_.paths) total += p.weight;
  double acc = 0;
  for (const PathSpec& p : m_.paths) path_cdf_.push_back((acc += p.weight) / total);

  machines_.resize(m_.machines.size());
  for (size_t i = 0; i < m_.machines.size(); ++i) machines_[i].cores.resize(static_cast<size_t>(m_.machines[i].cores));
  svc_hist_.resize(m_.services.size());
  svc_rr_.assign(m_.services.size(), 0);
  // which services are single FIFO servers (the Lindley fast path)
  std::vector<bool> lindley(m_.services.size(), false);
  for (size_t s = 0; s < m_.services.size(); ++s) {
    const ServiceSpec& sv = m_.services[s];
    bool ok = sv.simple && sv.threads == 1 && sv.lb != Lb::kLeastLoaded && !m_.no_fast_path;
    for (const StageSpec& st : sv.stages) ok = ok && st.queue == QueueKind::kFifo && st.batch == 1;
    lindley[s] = ok;
  }
  for (const PathSpec& p : m_.paths)
    for (const NodeSpec& n : p.nodes)
      if (n.stages.size() != 1 || n.hold_thread || n.release_thread || n.pool > 0)
        lindley[static_cast<size_t>(n.service)] = false;
  pools_.assign(static_cast<size_t>(m_.pools), PoolRt());
  uint64_t stream = kStreamStage;
  for (size_t s = 0; s < m_.services.size(); ++s) {
    const ServiceSpec& sv = m_.services[s];
    rng_stage_.emplace_back();
    for (size_t k = 0; k < sv.stages.size(); ++k) rng_stage_.back().emplace_back(DeriveSeed(m_.seed, stream++));
    svc_first_inst_.push_back(static_cast<int>(inst_.size()));
    for (const InstanceSpec& is : sv.instances) {
      Instance in;
      in.service = static_cast<int>(s);
      in.machine = is.machine;
      in.cores = is.cores;
      in.queues.resize(sv.stages.size());
      for (const StageSpec& st : sv.stages) in.defer_wake = in.defer_wake || st.batch > 1;
      in.lindley = lindley[s];
      for (size_t k = 0; k < sv.stages.size(); ++k) {
        in.queues[k].kind = sv.stages[k].queue;
        if (in.queues[k].kind != QueueKind::kFifo) in.queues[k].conns.resize(static_cast<size_t>(sv.connections));
      }
      in.first_thread = static_cast<int>(threads_.size());
      for (int k = 0; k < sv.threads; ++k) {
        Thread t;
        t.inst = static_cast<int>(inst_.size());
        t.index = k;
        threads_.push_back(t);
      }
      for (int k = sv.threads - 1; k >= 0; --k) in.idle.push_back(in.first_thread + k);
      inst_.push_back(std::move(in));
    }
  }
  // client connections index each service's connection sub-queues modulo its connection count
  for (const ServiceSpec& sv : m_.services)
    if (sv.connections < 1) throw ModelError("connections must be >= 1");

  if (m_.client.closed) {
    for (int u = 0; u < m_.client.users; ++u) {
      const double think = m_.client.think_us > 0 ? rng_arrival_.Exp(m_.client.think_us * 1000.0) : 0.0;
      Push(think, kUser, u);
    }
  } else {
    Push(rng_arrival_.Exp(1e9 / m_.client.epochs[0].qps), kArrival);
  }
  if (warmup_ > 0) Push(warmup_, kWarmup);
  if (control_ && m_.control_interval_s > 0) {
    win_svc_.assign(m_.services.size(), Hist());
    win_busy_mark_.assign(threads_.size(), 0.0);
    Push(m_.control_interval_s * 1e9, kControl);
  }

  const std::clock_t cpu0 = std::clock();
  while (!heap_.empty() && !stopped_) {
    const Event ev = heap_.pop();
    if (ev.t > end_) {
      Stop("duration reached", false);
      break;
    }
    now_ = ev.t;
    ++events_;
    if ((events_ & kProgressMask) == 0 && m_.progress_interval_s > 0) Progress();
    if (!mid_seen_ && now_ >= sample_t_[1]) {
      mid_seen_ = true;
      issued_by_[1] = issued_;
    }
    switch (ev.type()) {
      case kArrival: {
        NewRequest(-1);
        // next arrival, piecewise-constant rate (memoryless: resample at an epoch boundary)
        double t = now_;
        while (epoch_ < static_cast<int>(m_.client.epochs.size())) {
          const Epoch& e = m_.client.epochs[static_cast<size_t>(epoch_)];
          const double next = t + rng_arrival_.Exp(1e9 / e.qps);
          if (next <= e.end_s * 1e9) {
            Push(next, kArrival);
            break;
          }
          t = e.end_s * 1e9;
          ++epoch_;
        }
        break;
      }
      case kUser:
        NewRequest(ev.a);
        break;
      case kJobArrive:
        Enqueue(static_cast<Job*>(ev.p));
        break;
      case kCopies: {
        Request* r = static_cast<Request*>(ev.p);
        const NodeSpec& n = m_.paths[static_cast<size_t>(r->path)].nodes[static_cast<size_t>(ev.a)];
        const int base = svc_first_inst_[static_cast<size_t>(n.service)];
        const int ninst = static_cast<int>(m_.services[static_cast<size_t>(n.service)].instances.size());
        for (int k = 0; k < n.copies; ++k) {
          Job* j = job_pool_.Get();
          // the copy number keeps counting past the instance count, so that a chain that
          // follows the copies onto a service with more instances still spreads them
          const int copy = ev.b + k;
          *j = Job{r, ev.a, 0, base + copy % ninst, r->conn, copy, 0};
          j->spec = &n;
          Enqueue(j);
        }
        break;
      }
      case kDone:
        Done(ev.a);
        break;
      case kWake:
        MakeRunnable(ev.a);
        break;
      case kControl:
        Control();
        break;
      case kWarmup:
        measure_start_ = now_;
        issued_by_[0] = issued_;
        for (Thread& t : threads_) t.busy_time = 0;
        std::fill(win_busy_mark_.begin(), win_busy_mark_.end(), 0.0);
        for (MachineRt& mc : machines_)
          for (Core& c : mc.cores) c.busy_time = 0;
        for (Instance& in : inst_)
          for (StageQ& q : in.queues) {
            q.area = 0;
            q.last = now_;
            q.max_len = q.len;
          }
        break;
    }
    if (live_jobs_ > m_.max_live_jobs) Stop("more than " + std::to_string(m_.max_live_jobs) + " jobs in flight", true);
  }
  if (!stopped_) Stop("no more events", false);
  const double cpu_s = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  const double sim_end = std::min(now_, end_);
  const double window = std::max(1e-9, sim_end - measure_start_);
  // in-progress busy periods up to the end
  for (size_t tid = 0; tid < threads_.size(); ++tid) {
    Thread& t = threads_[tid];
    if (!t.batch.empty()) {
      const double b = sim_end - std::max(t.start, measure_start_);
      if (b > 0) {
        t.busy_time += b;
        if (t.core >= 0)
          machines_[static_cast<size_t>(inst_[static_cast<size_t>(t.inst)].machine)].cores[static_cast<size_t>(t.core)].busy_time += b;
      }
    }
  }
  // overload: the requests in the system grew by more than the arrivals' own noise in both
  // halves of the measured window (a backlog that grows linearly, whatever its level; docs/qsim.md)
  issued_by_[2] = issued_;
  int64_t in_system[3];
  for (int k = 0; k < 3; ++k) in_system[k] = static_cast<int64_t>(issued_by_[k]) - static_cast<int64_t>(done_by_[k]);
  const bool reached_end = stop_reason_ == "duration reached" || stop_reason_ == "no more events";
  if (!saturated_ && !m_.client.closed && mid_seen_ && reached_end) {
    const double half = static_cast<double>(issued_by_[2] - issued_by_[0]) / 2.0;
    const double noise = 16.0 + 4.0 * std::sqrt(std::max(1.0, half));
    const double grew1 = static_cast<double>(in_system[1] - in_system[0]);
    const double grew2 = static_cast<double>(in_system[2] - in_system[1]);
    if (grew1 > noise && grew2 > noise) {
      saturated_ = true;
      stop_reason_ = "the backlog grows: " + std::to_string(in_system[0]) + " requests in the system at the start of the measured window, " +
                     std::to_string(in_system[1]) + " half-way, " + std::to_string(in_system[2]) + " at its end";
    }
  }
  nlohmann::json out;
  out["saturated"] = saturated_;
  out["stop_reason"] = stop_reason_;
  out["sim_time_s"] = sim_end / 1e9;
  out["measured_s"] = window / 1e9;
  out["issued"] = issued_;
  out["completed"] = completed_;
  out["completed_measured"] = completed_measured_;
  out["throughput_qps"] = static_cast<double>(completed_measured_) / (window / 1e9);
  out["offered_qps"] = static_cast<double>(issued_measured_) / (window / 1e9);
  out["live_requests_end"] = live_requests_;
  out["in_system"] = {in_system[0], in_system[1], in_system[2]};
  out["events"] = events_;
  out["stage_runs"] = stage_runs_;
  out["jobs_run"] = jobs_run_;
  out["cpu_s"] = cpu_s;
  out["peak_rss_kib"] = PeakRssKib();
  out["pool"] = {{"requests", req_pool_.Allocated()}, {"jobs", job_pool_.Allocated()}};
  out["latency"] = e2e_.Summary();
  out["latency"]["ci"] = batches_.Intervals(e2e_);
  out["latency_buckets"] = e2e_.Buckets();
  nlohmann::json svcs = nlohmann::json::object();
  nlohmann::json threads = nlohmann::json::array();
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < m_.services.size(); ++s) {
    const ServiceSpec& sv = m_.services[s];
    nlohmann::json sj = svc_hist_[s].Summary();
    double busy = 0;
    const int first = svc_first_inst_[s];
    const int ninst = static_cast<int>(sv.instances.size());
    for (int i = first; i < first + ninst; ++i)
      for (int k = 0; k < sv.threads; ++k) busy += threads_[static_cast<size_t>(inst_[static_cast<size_t>(i)].first_thread + k)].busy_time;
    sj["thread_util"] = busy / window / (sv.threads * ninst);
    svcs[sv.name] = sj;
    if (ninst * sv.threads <= 64) {
      for (int i = first; i < first + ninst; ++i)
        for (int k = 0; k < sv.threads; ++k)
          threads.push_back({{"service", sv.name}, {"instance", i - first}, {"thread", k},
                             {"util", threads_[static_cast<size_t>(inst_[static_cast<size_t>(i)].first_thread + k)].busy_time / window}});
    }
    for (size_t k = 0; k < sv.stages.size(); ++k) {
      double area = 0;
      size_t mx = 0;
      for (int i = first; i < first + ninst; ++i) {
        StageQ& q = inst_[static_cast<size_t>(i)].queues[k];
        area += q.area + static_cast<double>(q.len) * (sim_end - std::max(q.last, measure_start_));
        mx = std::max(mx, q.max_len);
      }
      stages.push_back({{"service", sv.name}, {"stage", sv.stages[k].name},
                        {"mean_queue", area / window}, {"max_queue", mx}});
    }
  }
  out["services"] = svcs;
  out["threads"] = threads;
  out["stages"] = stages;
  nlohmann::json cores = nlohmann::json::array();
  for (size_t mi = 0; mi < machines_.size(); ++mi)
    for (size_t c = 0; c < machines_[mi].cores.size(); ++c)
      cores.push_back({{"machine", m_.machines[mi].name}, {"core", c}, {"util", machines_[mi].cores[c].busy_time / window}});
  out["cores"] = cores;
  return out;
}

}  // namespace

void Sim::Control() {
  nlohmann::json rep;
  rep["t_s"] = now_ / 1e9;
  rep["count"] = win_e2e_.Count();
  rep["mean_us"] = win_e2e_.Mean() / 1e3;
  rep["p99_us"] = static_cast<double>(win_e2e_.Percentile(0.99)) / 1e3;
  std::vector<double> busy(m_.services.size(), 0.0);
  std::vector<int> cores(m_.services.size(), 0);
  for (size_t tid = 0; tid < threads_.size(); ++tid) {
    const Thread& t = threads_[tid];
    const size_t s = static_cast<size_t>(inst_[static_cast<size_t>(t.inst)].service);
    busy[s] += t.busy_time - win_busy_mark_[tid];
    win_busy_mark_[tid] = t.busy_time;
  }
  for (const Instance& in : inst_) {
    const ServiceSpec& sv = m_.services[static_cast<size_t>(in.service)];
    cores[static_cast<size_t>(in.service)] += sv.simple ? sv.threads : static_cast<int>(in.cores.size());
  }
  nlohmann::json svcs = nlohmann::json::array();
  for (size_t s = 0; s < m_.services.size(); ++s) {
    const Hist& h = win_svc_[s];
    svcs.push_back({{"name", m_.services[s].name}, {"count", h.Count()}, {"mean_us", h.Mean() / 1e3},
                    {"p99_us", static_cast<double>(h.Percentile(0.99)) / 1e3}, {"busy_core_s", busy[s] / 1e9},
                    {"cores", cores[s]}, {"freq_ratio", freq_ratio_[s]}});
  }
  rep["services"] = svcs;
  const nlohmann::json ans = (*control_)(rep);
  if (ans.is_object()) {
    if (ans.value("stop", false)) {
      Stop("stopped by the controller", false);
      return;
    }
    if (ans.contains("freq_ratio")) {
      const auto& f = ans["freq_ratio"];
      if (!f.is_array() || f.size() != freq_ratio_.size())
        throw ModelError("controller: freq_ratio must list one ratio per service");
      for (size_t s = 0; s < f.size(); ++s) {
        if (!f[s].is_number() || !(f[s].get<double>() > 0))
          throw ModelError("controller: a freq_ratio must be a positive number");
        freq_ratio_[s] = f[s].get<double>();
      }
    }
  }
  win_e2e_ = Hist();
  for (Hist& h : win_svc_) h = Hist();
  Push(now_ + m_.control_interval_s * 1e9, kControl);
}

void Sim::Progress() {
  const auto wall = std::chrono::steady_clock::now();
  if (wall < progress_next_) return;
  progress_next_ = wall + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(m_.progress_interval_s));
  std::fprintf(stderr, "progress %.9g %.9g %llu %llu\n", now_ / 1e9, end_ / 1e9,
               static_cast<unsigned long long>(completed_),
               static_cast<unsigned long long>(m_.max_requests));
  std::fflush(stderr);
}

nlohmann::json Simulate(const Model& m) {
  Sim s(m);
  return s.Run();
}

nlohmann::json Simulate(const Model& m, const Controller& control) {
  Sim s(m, &control);
  return s.Run();
}

}  // namespace musku::qsim
