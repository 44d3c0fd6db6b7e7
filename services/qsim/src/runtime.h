// The simulator's run-time state (docs/qsim.md "Engine"): requests, jobs, the queues of a stage,
// threads, cores, instances and machines. // Internal to the engine (not part of engine.h's API).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "model.h"
#include "rng.h"

namespace musku::qsim::internal {

// A path node compiled at set-up (docs/qsim.md "2026-11-29 night: a compiled path"): what a
// visit would otherwise look up or decide per job. A job keeps a pointer to its node's record.
struct NodeRt {
  const NodeSpec* spec = nullptr;
  int node = 0;
  int service = 0;
  int base = 0;    // the service's first instance
  int ninst = 1;   // its instance count
  // The instance is base + conn % ninst whatever the request did before: lb = "connection"
  // (Route's answer and so the sticky instance's), or one instance. Such a service's sticky
  // entry is neither read nor written.
  bool by_conn = false;
  bool plain = false;  // no connection pool, no held thread to release (Enqueue's checks)
  // The child this node hands its job on to, resolved: branch "all" with one child, which has
  // no join and no fan-out copies (FinishNode: no routing decision, no lookup); else null
  const NodeRt* only = nullptr;
  // The node's first stage (the only one at a Lindley instance) and its batch-of-one service
  // time: exponential without a size table (exp1) has the mean mean1, the same value
  // ServiceTime computes; backlog_mean_ns is Lindley's divisor for the backlog bound.
  int stage = 0;
  const StageSpec* st = nullptr;
  bool exp1 = false;
  double mean1 = 0;
  double backlog_mean_ns = 1;
};

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
  bool pooled = false;  // holds one of its node's pool connections
  double node_arrival = 0;
  Job* next = nullptr;  // the next job on the same connection sub-queue (ConnQ)
  const NodeSpec* spec = nullptr;  // paths[req->path].nodes[node], kept to save the loads
  const NodeRt* rt = nullptr;      // the same node compiled (NodeRt)
};
// One cache line: a fan-out writes a thousand jobs a request (with the NodeRt pointer and
// `pooled` after `node_arrival`, 72 bytes cost the imported fan-out 2.4x the LL write misses)
static_assert(sizeof(Job) <= 64, "a job fits one cache line");

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
  Rng rng;  // this (instance, stage)'s service times (docs/qsim.md "Engine": random streams)
};

struct Core {
  bool busy = false;
  int last_thread = -1;
  double busy_time = 0;
};

// The most stages a thread chains into one completion event (Sim::Chain).
constexpr int kMaxChain = 8;

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
  // A chain (Sim::Chain): the job's next stages drawn ahead; stage chain_stage[k] starts at
  // chain_t[k] (the end of the one before), the completion event is the last one's end
  int chain_n = 0;
  double chain_t[kMaxChain] = {};
  int chain_stage[kMaxChain] = {};
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
  bool direct = false;     // a job that finds it empty may go straight to an idle thread (EnqueueQ)
  bool lindley = false;    // FCFS servers: departures computed on arrival (Sim::Lindley)
  bool chain = false;      // one thread on cores of its own: a job's stages may chain (Sim::Chain)
  int max_entry = 0;       // the highest stage index a job enters the instance at (a node's first)
  const ServiceSpec* sv = nullptr;  // its service
  double* busy_thread0 = nullptr;   // Lindley: thread 0's busy time
  double* busy_core0 = nullptr;     // Lindley: core 0's busy time (null: simple execution)
  double free_at = 0;              // Lindley, one thread: when it is next free
  std::vector<double> free_at_k;  // Lindley, several: when each is next free (size: threads)
};

struct MachineRt {
  std::vector<Core> cores;
  std::deque<int> runq;  // runnable threads waiting for a core
};

}  // namespace musku::qsim::internal
