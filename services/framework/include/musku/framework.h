// musku threading framework (μTune-style): the service-facing API.
//
// A service implements only its request logic; the framework owns every thread:
//   * network pollers   - one gRPC ServerCompletionQueue each; block (cq->Next) or poll
//                         (AsyncNext with a zero deadline in a loop);
//   * workers           - dispatch models hand each request to a worker (per-worker queue,
//                         condvar wake-up, worker choice a swappable function);
//   * response threads  - async-leaf models complete leaf calls on their CompletionQueues and
//                         finalise the response there.
// Eight models = {sync, async leaf calls} x {inline, dispatch} x {block, poll}; the model and the
// pool sizes can be switched at run time (Admin.SetThreading, or --threading auto with a trained
// decision table) without dropping or duplicating an RPC.
//
// Leaf server:
//   class MyLeaf : public musku::LeafHandler<LeafReq, LeafResp> {
//     grpc::Status Handle(const LeafReq& req, LeafResp* resp) override;  // thread-safe
//   };
//   musku::ServerOptions opts; std::string err;
//   if (!musku::ParseServerOptions(argc, argv, "myleaf", &opts, &err)) { fprintf(stderr, ...); return 2; }
//   my::Leaf::AsyncService svc; MyLeaf logic(...);
//   musku::Server server(opts, musku::Role::kLeaf);
//   server.AddLeafMethod(&svc, &my::Leaf::AsyncService::RequestCall, &logic);
//   return server.Run();  // until SIGTERM/SIGINT, then orderly shutdown; returns exit status
//
// Mid-tier:
//   class MyMid : public musku::MidTierHandler<Req, Resp, LeafReq, LeafResp> {
//     grpc::Status Process(const Req&, musku::FanOut<LeafReq>* out) override;   // out->To(i)
//     grpc::Status Finalize(const Req&, std::vector<musku::LeafReply<LeafResp>>& replies,
//                           Resp* resp) override;
//   };
//   musku::LeafSet<my::Leaf> leaves(opts.leaves, opts.leaf_timeout_ms);
//   server.AddMidTierMethod(&svc, &my::Mid::AsyncService::RequestQuery, &logic, &leaves,
//                           &my::Leaf::Stub::PrepareAsyncCall);
//
// See services/framework/README.md.
#pragma once

#include <google/protobuf/message_lite.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace musku {

// ---------------------------------------------------------------------------------------------
// Threading models and pool sizes
// ---------------------------------------------------------------------------------------------

enum class LeafCallMode { kSync, kAsync };      // sync: the thread running the logic waits
enum class DispatchMode { kInline, kDispatch }; // inline: the network poller runs the logic
enum class WaitMode { kBlock, kPoll };          // block: cq->Next; poll: AsyncNext(0) loop

struct ThreadingModel {
  LeafCallMode leaf = LeafCallMode::kSync;
  DispatchMode dispatch = DispatchMode::kInline;
  WaitMode wait = WaitMode::kBlock;

  // "sync-inline-block", "async-dispatch-poll", ... (leaf-dispatch-wait)
  std::string Name() const;
  static std::optional<ThreadingModel> Parse(std::string_view name);
  static std::vector<ThreadingModel> All();  // the eight models
  bool operator==(const ThreadingModel& o) const {
    return leaf == o.leaf && dispatch == o.dispatch && wait == o.wait;
  }
  bool operator!=(const ThreadingModel& o) const { return !(*this == o); }
};

struct PoolSizes {
  int pollers = 1;     // network poller threads (= server completion queues in use)
  int workers = 0;     // dispatch worker threads (>= 1 for dispatch models)
  int responders = 0;  // response threads; async-leaf models with 0: the pollers take leaf replies
  bool operator==(const PoolSizes& o) const {
    return pollers == o.pollers && workers == o.workers && responders == o.responders;
  }
};

struct Threading {
  ThreadingModel model;
  PoolSizes pools;
  std::string ToString() const;  // "async-dispatch-block p=1 w=2 r=1"
  bool operator==(const Threading& o) const { return model == o.model && pools == o.pools; }
  bool operator!=(const Threading& o) const { return !(*this == o); }
};

// "" if `t` is possible with these maximum pool sizes, else why not.
std::string ValidateThreading(const Threading& t, const PoolSizes& max);

// ---------------------------------------------------------------------------------------------
// Options and command line
// ---------------------------------------------------------------------------------------------

enum class Role { kLeaf, kMidTier };

// How a mid-tier reaches its leaves (--leaf-transport):
//   unary - one gRPC unary call per leaf call (μSuite's design);
//   batch - one long-lived bidirectional stream per leaf; the leaf calls queued while the
//           previous message was on the wire travel together in the next one (musku.LeafBatch,
//           services/common/proto/batch.proto). Same Process/Finalize, same eight models,
//           same deadlines and error statuses; fewer frames, wake-ups and per-call set-ups.
enum class LeafTransport { kUnary, kBatch };

struct ServerOptions {
  std::string service = "service";  // name reported by Health/Stats and checked in tables
  std::string listen = "127.0.0.1:0";  // --listen HOST:PORT (port 0 = pick a free port)
  std::string port_file;               // --port-file PATH: the bound port is written there
  Threading threading{ThreadingModel{}, PoolSizes{1, 0, 0}};  // --threading MODEL + pool flags
  bool auto_threading = false;         // --threading auto
  std::string threading_table;         // --threading-table PATH (JSON from `musku tune train`)
  PoolSizes max_pools{4, 8, 4};        // --max-pollers/--max-workers/--max-responders
  int contexts_per_cq = 64;            // --contexts-per-cq: RPCs armed per completion queue
  std::vector<std::string> leaves;     // --leaves HOST:PORT,HOST:PORT,... (mid-tiers)
  int leaf_timeout_ms = 1000;          // --leaf-timeout-ms: deadline of every leaf call
  LeafTransport leaf_transport = LeafTransport::kUnary;  // --leaf-transport unary|batch
  int shutdown_grace_ms = 2000;        // --shutdown-grace-ms: in-flight RPCs get this long
  int auto_interval_ms = 5;            // --auto-interval-ms: how often auto re-decides (at most)
  int auto_persist_ms = 20;            // --auto-persist-ms: auto moves up (a load rise, or the
                                       // backlog at the overload mark) once it has held this long
  std::string pin;                     // --pin "p:0,w:1,r:1": pin pools to CPUs ("" = no)
  std::map<std::string, std::string> extra;  // any other --key value (service-specific)
  std::vector<std::string> positional;       // non-flag arguments

  // Service-specific flag helpers (read from `extra`); *error set on a malformed value.
  std::string Get(const std::string& key, const std::string& def = "") const;
  long GetInt(const std::string& key, long def, std::string* error) const;
  double GetDouble(const std::string& key, double def, std::string* error) const;
  // Flags in `extra` the service never read through the helpers above, i.e. unknown flags
  // ("--foo, --bar"; "" if none). Server::Start refuses to run with any.
  std::string UnreadFlags() const;

 private:
  mutable std::set<std::string> read_;  // keys the service asked for
};

// Parses the framework flags:
//   --threading auto|MODEL --pollers N --workers N --responders N --threading-table PATH
//   --max-pollers N --max-workers N --max-responders N --listen H:P --port-file PATH
//   --leaves H:P,... --leaf-timeout-ms N --leaf-transport unary|batch --shutdown-grace-ms N
//   --contexts-per-cq N --pin SPEC
// plus any service-specific "--key value" (into opts->extra). Flags may also be "--key=value".
// Returns false with *error set on a bad flag/value (the caller prints it and exits 2).
bool ParseServerOptions(int argc, char** argv, const std::string& service, ServerOptions* opts,
                        std::string* error);
std::string ServerOptionsUsage();

// ---------------------------------------------------------------------------------------------
// Request logic interfaces
// ---------------------------------------------------------------------------------------------

template <class Req, class Resp>
class LeafHandler {
 public:
  virtual ~LeafHandler() = default;
  // Called concurrently from pollers or workers. A non-OK status is sent to the client as is.
  virtual grpc::Status Handle(const Req& req, Resp* resp) = 0;
};

// The leaf requests a mid-tier request fans out into (built by MidTierHandler::Process).
template <class LeafReq>
class FanOut {
 public:
  // Adds one call to leaf `leaf` (0 <= leaf < num_leaves()) and returns its request to fill.
  // A leaf may be called more than once. Returns nullptr for an out-of-range leaf.
  LeafReq* To(int leaf) {
    if (leaf < 0 || leaf >= num_leaves_) return nullptr;
    if (used_ == calls_.size()) calls_.emplace_back();
    auto& c = calls_[used_++];
    c.first = leaf;
    c.second.Clear();
    return &c.second;
  }
  int num_leaves() const { return num_leaves_; }
  size_t size() const { return used_; }
  const std::pair<int, LeafReq>& call(size_t i) const { return calls_[i]; }
  void Reset(int num_leaves) {
    num_leaves_ = num_leaves;
    used_ = 0;
  }

 private:
  int num_leaves_ = 0;
  size_t used_ = 0;
  std::vector<std::pair<int, LeafReq>> calls_;  // reused across RPCs
};

// The deadline of the leaf call this thread is handling, valid inside LeafHandler::Handle: its
// caller's, over either leaf transport (the batch transport carries each call's time left);
// time_point::max() when the caller set none. A leaf that waits on a backend of its own
// (Router: memcached) bounds that wait by it rather than by a fixed timeout that a busy host
// overruns.
std::chrono::system_clock::time_point CallDeadline();

template <class LeafResp>
struct LeafReply {
  int leaf = -1;        // which leaf answered (index into --leaves)
  grpc::Status status;  // DEADLINE_EXCEEDED after --leaf-timeout-ms, UNAVAILABLE if down, ...
  LeafResp reply;
};

template <class Req, class Resp, class LeafReq, class LeafResp>
class MidTierHandler {
 public:
  virtual ~MidTierHandler() = default;
  // Validates the request and adds the leaf calls (possibly none). A non-OK status is sent to the
  // client without calling any leaf. Called concurrently.
  virtual grpc::Status Process(const Req& req, FanOut<LeafReq>* out) = 0;
  // Merges the leaf replies (in FanOut order; check each status) into `resp`. Called
  // concurrently, on the thread the model says (worker / poller / response thread).
  virtual grpc::Status Finalize(const Req& req, std::vector<LeafReply<LeafResp>>& replies,
                                Resp* resp) = 0;
};

// Channel arguments for a mid-tier's leaf channels: a connection per leaf (not shared), and none
// of the per-call machinery a data-centre fan-out does not use (transparent retries, channelz
// call counting, BDP pings), which costs CPU on every leaf call. A restarted leaf is found again
// within 100 ms .. 1 s (gRPC's default back-off starts at 1 s and grows to 120 s): a refused
// connect fails at once and the next attempt starts 100 ms after the last one did.
// GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is not a back-off but the connect timeout's floor (gRPC's
// subchannel: the attempt's deadline is max(next attempt, now + this)): it covers the TCP connect
// and the HTTP/2 preface and SETTINGS exchange with a leaf that may be busy. At 100 ms a leaf on
// a loaded host that took longer to answer the SETTINGS put the channel in TRANSIENT_FAILURE, and
// every call on it (a batch stream's start included) failed at once with UNAVAILABLE until the
// next attempt. The handshake gets kLeafConnectTimeoutMs; a call still ends at its own deadline.
inline constexpr int kLeafConnectTimeoutMs = 20000;
inline grpc::ChannelArguments LeafChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kLeafConnectTimeoutMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return args;
}

namespace detail {

// The mid-tier end of --leaf-transport batch: one stream per leaf, driven by one framework
// thread. Send() queues a call and returns; its outcome (the reply's bytes and status, or
// DEADLINE_EXCEEDED at the deadline, or UNAVAILABLE when the stream breaks) is written to
// *payload / *status and then `tag` (a Tag) is posted to `cq` through *alarm: the thread the
// model says takes it exactly as it takes a unary call's completion. With `cq` null the
// transport thread itself, which took the reply, runs the call's OnLeafDone (async models
// without response threads: no hand-off). Every call completes exactly once.
class BatchTransport {
 public:
  struct Done {
    std::string* payload;
    grpc::Status* status;
    grpc::CompletionQueue* cq;
    void* tag;
    grpc::Alarm* alarm;
  };
  explicit BatchTransport(std::vector<std::shared_ptr<grpc::Channel>> channels);
  ~BatchTransport();  // cancels the streams; in-flight calls complete with CANCELLED
  BatchTransport(const BatchTransport&) = delete;
  BatchTransport& operator=(const BatchTransport&) = delete;
  void Send(int leaf, uint64_t method, const google::protobuf::MessageLite& request,
            std::chrono::system_clock::time_point deadline, const Done& done);
  // Messages written and calls they carried so far (calls / messages = the batching achieved).
  uint64_t messages() const;
  uint64_t calls() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The key a batched call names its leaf method by: FNV-1a of "Request>Reply" type names.
uint64_t BatchMethodKey(const std::string& request_type, const std::string& reply_type);

}  // namespace detail

// Connections to the leaves: one channel + stub per address (LeafService is the generated
// service class, e.g. setalgebra::Leaf); the batch transport over the same channels is made
// on first use.
template <class LeafService>
class LeafSet {
 public:
  using Stub = typename LeafService::Stub;
  LeafSet(const std::vector<std::string>& addresses, int timeout_ms)
      : addresses_(addresses), timeout_(std::chrono::milliseconds(timeout_ms)) {
    for (const auto& a : addresses) {
      channels_.push_back(
          grpc::CreateCustomChannel(a, grpc::InsecureChannelCredentials(), LeafChannelArgs()));
      stubs_.push_back(LeafService::NewStub(channels_.back()));
    }
  }
  int size() const { return static_cast<int>(stubs_.size()); }
  Stub* stub(int i) { return stubs_[static_cast<size_t>(i)].get(); }
  const std::string& address(int i) const { return addresses_[static_cast<size_t>(i)]; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  detail::BatchTransport* batch() {
    std::call_once(batch_once_, [this] { batch_ = std::make_unique<detail::BatchTransport>(channels_); });
    return batch_.get();
  }

 private:
  std::vector<std::string> addresses_;
  std::chrono::milliseconds timeout_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<Stub>> stubs_;
  std::once_flag batch_once_;
  std::unique_ptr<detail::BatchTransport> batch_;
};

// ---------------------------------------------------------------------------------------------
// Internals the templates below need (not for services to use directly)
// ---------------------------------------------------------------------------------------------
namespace detail {

class Engine;
class CallBase;
class AdminService;      // Health, Stats, Get/SetThreading (admin.cc)
class BatchLeafService;  // musku.LeafBatch, the batch transport's leaf end (batch_leaf.cc)

struct Tag {
  enum Kind : uint8_t { kNew, kFinish, kLeaf, kRead, kWrite };
  Kind kind;
  CallBase* call;
  int slot;  // leaf slot for kLeaf
};

// Per-thread execution context: the thread's private CQ for synchronous leaf calls.
class Exec {
 public:
  virtual ~Exec() = default;
  virtual grpc::CompletionQueue* private_cq() = 0;
  virtual WaitMode wait_mode() const = 0;
};

class CallBase {
 public:
  virtual ~CallBase() = default;
  // Fresh ServerContext/writer, then Request<Method>(..., cq, cq, &new_tag).
  virtual void Arm(grpc::ServerCompletionQueue* cq) = 0;
  // The request logic; ends with FinishRpc() now (sync) or later from OnLeafDone (async).
  virtual void Run(Exec& exec) = 0;
  // Async leaf calls: one leaf call completed (on a response thread or the poller).
  virtual void OnLeafDone(int slot, bool ok) { (void)slot, (void)ok; }
  // Streams (the leaf end of the batch transport): a read or write completed on the poller.
  virtual void OnStreamEvent(Tag::Kind kind, bool ok, Exec& exec) { (void)kind, (void)ok, (void)exec; }

  Tag new_tag{Tag::kNew, this, 0};
  Tag finish_tag{Tag::kFinish, this, 0};
  Engine* engine = nullptr;
  int cq_index = -1;           // the server CQ this call is armed on
  size_t factory = 0;          // which method factory made it
  bool admin = false;          // admin calls always run inline on the poller
  bool counted = true;         // counted in stats / load detection
  int64_t arrival_ns = 0;      // monotonic arrival time
};

int64_t MonotonicNs();

// Sets CallDeadline() for this thread while a handler runs.
class DeadlineScope {
 public:
  explicit DeadlineScope(std::chrono::system_clock::time_point deadline);
  ~DeadlineScope();
  DeadlineScope(const DeadlineScope&) = delete;
  DeadlineScope& operator=(const DeadlineScope&) = delete;

 private:
  std::chrono::system_clock::time_point saved_;
};

// Engine entry points used by the call templates.
LeafCallMode CurrentLeafMode(Engine* e);
LeafTransport LeafTransportOf(Engine* e);
int ResponderCount(Engine* e);  // response threads in use now
// A leaf method as the batch stream calls it: parse, Handle, serialize.
using BatchHandler = std::function<grpc::Status(const std::string& request, std::string* reply)>;
// Picks the CQ an async fan-out of `n` leaf calls completes on: a response thread's, or (no
// response threads) the server CQ `call` arrived on, so its poller takes the replies too.
grpc::CompletionQueue* PickResponderCq(Engine* e, CallBase* call, int n);
void NoteLeafDone(Engine* e, grpc::CompletionQueue* cq);
void NoteFinish(Engine* e, CallBase* call, const grpc::Status& status);
void NoteLeafErrors(Engine* e, int n);
// Server-side phase statistics (Admin Stats' `phases`; musku qsim profile builds its model from
// them): queue = arrival -> the handler starts, handler = a leaf's Handle or a mid-tier's
// Process, leaf_wait = the leaf calls sent -> the last reply taken, finalize = Finalize.
enum Phase : int { kPhaseQueue, kPhaseHandler, kPhaseLeafWait, kPhaseFinalize, kPhases };
void NotePhase(Engine* e, CallBase* call, Phase p, int64_t wall_ns, int64_t cpu_ns);
int64_t ThreadCpuNs();  // CPU time of the calling thread
// Waits on a private CQ for `n` leaf tags in the current wait mode.
void WaitPrivate(Exec& exec, int n, const std::function<void(Tag*, bool)>& on_tag);

template <class Fn>
struct ServerMethodTraits;
template <class C, class Req, class Resp>
struct ServerMethodTraits<void (C::*)(grpc::ServerContext*, Req*,
                                      grpc::ServerAsyncResponseWriter<Resp>*,
                                      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*)> {
  using Request = Req;
  using Response = Resp;
};

template <class Fn>
struct ClientMethodTraits;
template <class Stub, class Req, class Resp>
struct ClientMethodTraits<std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> (Stub::*)(
    grpc::ClientContext*, const Req&, grpc::CompletionQueue*)> {
  using Request = Req;
  using Response = Resp;
};

// A leaf (or admin) RPC: handler runs on the poller (inline) or a worker (dispatch).
template <class Service, class RequestFn, class Req, class Resp>
class UnaryCall final : public CallBase {
 public:
  UnaryCall(Service* svc, RequestFn fn, LeafHandler<Req, Resp>* handler)
      : svc_(svc), fn_(fn), handler_(handler) {}
  void Arm(grpc::ServerCompletionQueue* cq) override {
    ctx_ = std::make_unique<grpc::ServerContext>();
    req_.Clear();
    resp_.Clear();
    writer_ = std::make_unique<grpc::ServerAsyncResponseWriter<Resp>>(ctx_.get());
    (svc_->*fn_)(ctx_.get(), &req_, writer_.get(), cq, cq, &new_tag);
  }
  void Run(Exec&) override {
    grpc::Status st;
    const int64_t t0 = MonotonicNs(), c0 = ThreadCpuNs();
    {
      DeadlineScope scope(ctx_->deadline());
      st = handler_->Handle(req_, &resp_);
    }
    NotePhase(engine, this, kPhaseQueue, t0 - arrival_ns, 0);
    NotePhase(engine, this, kPhaseHandler, MonotonicNs() - t0, ThreadCpuNs() - c0);
    NoteFinish(engine, this, st);
    if (st.ok())
      writer_->Finish(resp_, st, &finish_tag);
    else
      writer_->FinishWithError(st, &finish_tag);
  }

 private:
  Service* svc_;
  RequestFn fn_;
  LeafHandler<Req, Resp>* handler_;
  std::unique_ptr<grpc::ServerContext> ctx_;
  Req req_;
  Resp resp_;
  std::unique_ptr<grpc::ServerAsyncResponseWriter<Resp>> writer_;
};

template <class Service, class RequestFn, class Req, class Resp, class LeafService, class LeafFn,
          class LeafReq, class LeafResp>
class MidTierCall final : public CallBase {
 public:
  MidTierCall(Service* svc, RequestFn fn, MidTierHandler<Req, Resp, LeafReq, LeafResp>* handler,
              LeafSet<LeafService>* leaves, LeafFn leaf_fn)
      : svc_(svc), fn_(fn), handler_(handler), leaves_(leaves), leaf_fn_(leaf_fn) {}

  void Arm(grpc::ServerCompletionQueue* cq) override {
    ctx_ = std::make_unique<grpc::ServerContext>();
    req_.Clear();
    resp_.Clear();
    writer_ = std::make_unique<grpc::ServerAsyncResponseWriter<Resp>>(ctx_.get());
    (svc_->*fn_)(ctx_.get(), &req_, writer_.get(), cq, cq, &new_tag);
  }

  void Run(Exec& exec) override {
    const int64_t t0 = MonotonicNs(), c0 = ThreadCpuNs();
    fanout_.Reset(leaves_->size());
    grpc::Status st = handler_->Process(req_, &fanout_);
    sent_ns_ = MonotonicNs();
    NotePhase(engine, this, kPhaseQueue, t0 - arrival_ns, 0);
    NotePhase(engine, this, kPhaseHandler, sent_ns_ - t0, ThreadCpuNs() - c0);
    if (!st.ok()) return FinishRpc(st);
    const size_t n = fanout_.size();
    if (n == 0) return Complete();
    if (slots_.size() < n) slots_.resize(n);
    replies_.resize(n);
    const auto deadline = std::chrono::system_clock::now() + leaves_->timeout();
    batched_ = LeafTransportOf(engine) == LeafTransport::kBatch;
    if (CurrentLeafMode(engine) == LeafCallMode::kSync) {
      grpc::CompletionQueue* cq = exec.private_cq();
      for (size_t i = 0; i < n; ++i) Start(i, cq, deadline);
      WaitPrivate(exec, static_cast<int>(n), [](Tag*, bool) {});
      return Complete();
    }
    // No response threads: whoever takes the leaf replies finalises (unary: the poller whose
    // queue they land on; batch: the transport thread that reads them, cq null).
    grpc::CompletionQueue* cq = batched_ && ResponderCount(engine) == 0
                                    ? nullptr
                                    : PickResponderCq(engine, this, static_cast<int>(n));
    response_cq_ = cq;
    pending_.store(static_cast<int>(n), std::memory_order_relaxed);
    // After the last Start() another thread may complete and recycle this call: touch nothing.
    for (size_t i = 0; i < n; ++i) Start(i, cq, deadline);
  }

  void OnLeafDone(int, bool) override {
    grpc::CompletionQueue* cq = response_cq_;
    Engine* e = engine;
    const bool last = pending_.fetch_sub(1, std::memory_order_acq_rel) == 1;
    if (last) Complete();
    NoteLeafDone(e, cq);
  }

 private:
  struct Slot {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncResponseReader<LeafResp>> rpc;
    Tag tag{Tag::kLeaf, nullptr, 0};
    std::unique_ptr<grpc::Alarm> alarm;  // batch transport: posts the completion
    std::string payload;                 // batch transport: the reply's bytes
  };

  static uint64_t MethodKey() {
    static const uint64_t key = BatchMethodKey(LeafReq().GetTypeName(), LeafResp().GetTypeName());
    return key;
  }

  void Start(size_t i, grpc::CompletionQueue* cq, std::chrono::system_clock::time_point deadline) {
    Slot& s = slots_[i];
    const auto& call = fanout_.call(i);
    auto& r = replies_[i];
    r.leaf = call.first;
    r.reply.Clear();
    r.status = grpc::Status::OK;
    s.tag.call = this;
    s.tag.slot = static_cast<int>(i);
    if (batched_) {
      s.alarm = std::make_unique<grpc::Alarm>();
      s.payload.clear();
      leaves_->batch()->Send(call.first, MethodKey(), call.second, deadline,
                             {&s.payload, &r.status, cq, &s.tag, s.alarm.get()});
      return;
    }
    s.ctx = std::make_unique<grpc::ClientContext>();
    s.ctx->set_deadline(deadline);
    s.rpc = (leaves_->stub(call.first)->*leaf_fn_)(s.ctx.get(), call.second, cq);
    s.rpc->StartCall();
    s.rpc->Finish(&r.reply, &r.status, &s.tag);
  }

  void Complete() {
    const int64_t t0 = MonotonicNs(), c0 = ThreadCpuNs();
    if (fanout_.size() > 0) NotePhase(engine, this, kPhaseLeafWait, t0 - sent_ns_, 0);
    if (batched_) {
      for (size_t i = 0; i < replies_.size(); ++i) {
        auto& r = replies_[i];
        if (r.status.ok() && !r.reply.ParseFromString(slots_[i].payload))
          r.status = grpc::Status(grpc::StatusCode::INTERNAL, "leaf reply does not parse");
      }
    }
    int failed = 0;
    for (auto& r : replies_)
      if (!r.status.ok()) ++failed;
    if (failed) NoteLeafErrors(engine, failed);
    grpc::Status st = handler_->Finalize(req_, replies_, &resp_);
    NotePhase(engine, this, kPhaseFinalize, MonotonicNs() - t0, ThreadCpuNs() - c0);
    FinishRpc(st);
  }

  void FinishRpc(const grpc::Status& st) {
    replies_.clear();
    NoteFinish(engine, this, st);
    if (st.ok())
      writer_->Finish(resp_, st, &finish_tag);
    else
      writer_->FinishWithError(st, &finish_tag);
  }

  Service* svc_;
  RequestFn fn_;
  MidTierHandler<Req, Resp, LeafReq, LeafResp>* handler_;
  LeafSet<LeafService>* leaves_;
  LeafFn leaf_fn_;
  std::unique_ptr<grpc::ServerContext> ctx_;
  Req req_;
  Resp resp_;
  std::unique_ptr<grpc::ServerAsyncResponseWriter<Resp>> writer_;
  FanOut<LeafReq> fanout_;
  std::vector<Slot> slots_;
  std::vector<LeafReply<LeafResp>> replies_;
  std::atomic<int> pending_{0};
  grpc::CompletionQueue* response_cq_ = nullptr;
  bool batched_ = false;  // this RPC's leaf calls go over the batch transport
  int64_t sent_ns_ = 0;   // Process returned (the leaf calls go out)
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

class Server {
 public:
  Server(ServerOptions opts, Role role);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // A leaf-style method: handler->Handle per RPC.
  template <class Service, class RequestFn, class Req, class Resp>
  void AddLeafMethod(Service* svc, RequestFn fn, LeafHandler<Req, Resp>* handler) {
    using T = detail::ServerMethodTraits<RequestFn>;
    static_assert(std::is_same_v<typename T::Request, Req> &&
                      std::is_same_v<typename T::Response, Resp>,
                  "handler types do not match the RPC method");
    RegisterService(svc);
    AddCallFactory([svc, fn, handler] {
      return std::unique_ptr<detail::CallBase>(
          new detail::UnaryCall<Service, RequestFn, Req, Resp>(svc, fn, handler));
    });
    // The same handler behind musku.LeafBatch, for mid-tiers on --leaf-transport batch.
    RegisterBatchHandler(detail::BatchMethodKey(Req().GetTypeName(), Resp().GetTypeName()),
                         [handler](const std::string& in, std::string* out) {
                           thread_local Req req;
                           thread_local Resp resp;
                           req.Clear();
                           resp.Clear();
                           if (!req.ParseFromString(in))
                             return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                 "malformed request");
                           grpc::Status st = handler->Handle(req, &resp);
                           if (st.ok()) resp.SerializeToString(out);
                           return st;
                         });
  }

  // A mid-tier method: handler->Process fans out to `leaves` through leaf_fn (the generated
  // Stub::PrepareAsync<Method>), handler->Finalize merges the replies.
  template <class Service, class RequestFn, class Req, class Resp, class LeafReq, class LeafResp,
            class LeafService, class LeafFn>
  void AddMidTierMethod(Service* svc, RequestFn fn,
                        MidTierHandler<Req, Resp, LeafReq, LeafResp>* handler,
                        LeafSet<LeafService>* leaves, LeafFn leaf_fn) {
    using T = detail::ServerMethodTraits<RequestFn>;
    using L = detail::ClientMethodTraits<LeafFn>;
    static_assert(std::is_same_v<typename T::Request, Req> &&
                      std::is_same_v<typename T::Response, Resp>,
                  "handler types do not match the RPC method");
    static_assert(std::is_same_v<typename L::Request, LeafReq> &&
                      std::is_same_v<typename L::Response, LeafResp>,
                  "handler leaf types do not match the leaf method");
    RegisterService(svc);
    AddCallFactory([svc, fn, handler, leaves, leaf_fn] {
      return std::unique_ptr<detail::CallBase>(
          new detail::MidTierCall<Service, RequestFn, Req, Resp, LeafService, LeafFn, LeafReq,
                                  LeafResp>(svc, fn, handler, leaves, leaf_fn));
    });
  }

  // Binds, starts all threads. Returns false with *error (e.g. port in use, bad table handled
  // as a warning, not an error).
  bool Start(std::string* error);
  // Blocks until SIGTERM/SIGINT (or Shutdown() from another thread).
  void Wait();
  // Orderly shutdown: stop accepting, let in-flight RPCs finish (grace), drain, join. Idempotent.
  void Shutdown();
  // Start + Wait + Shutdown; prints errors; returns the process exit status (0 ok, 1 error).
  int Run();

  int port() const;
  const ServerOptions& options() const;

  // Threading control (also reachable over Admin.SetThreading / GetThreading).
  // Returns "" on success, else why the request was refused (configuration unchanged).
  std::string SetThreading(const Threading& t);
  std::string SetAuto(const std::string& table_path);
  Threading CurrentThreading() const;
  double MeasuredQps() const;

  // Dispatch: worker choice (default round-robin over the active workers). `fn(n_active)`
  // returns a worker index in [0, n_active). Set before Start().
  void SetWorkerChooser(std::function<int(int)> fn);

  // Blocks SIGTERM/SIGINT in the calling thread (call first thing in main, before any thread is
  // created) so that Wait() receives them with sigwait(). Run() calls it itself if needed.
  static void BlockTerminationSignals();

 private:
  void RegisterService(grpc::Service* svc);
  void RegisterBatchHandler(uint64_t key, detail::BatchHandler fn);
  void AddCallFactory(std::function<std::unique_ptr<detail::CallBase>()> factory);
  std::unique_ptr<detail::Engine> engine_;
  std::unique_ptr<detail::AdminService> admin_;
  std::unique_ptr<detail::BatchLeafService> batch_;
};

}  // namespace musku
