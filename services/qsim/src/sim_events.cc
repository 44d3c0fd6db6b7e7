// The event loop and its handlers: requests through paths, jobs through stage queues, threads
// onto cores, the Lindley fast path (docs/qsim.md "Engine"). The hot path: one translation unit.
#include "sim.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace musku::qsim::internal {

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

// v = n copies of x; in place when v already has n elements (a recycled request of the same path)
template <typename T>
static inline void Reset(std::vector<T>& v, size_t n, T x) {
  if (v.size() != n) {
    v.assign(n, x);
    return;
  }
  for (T& e : v) e = x;
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
  // a pooled request keeps its vectors: set them in place (no call to assign's general code)
  Reset(r->join_count, static_cast<size_t>(ps.join_slots), 0);
  Reset(r->join_time, static_cast<size_t>(ps.join_slots), 0.0);
  Reset(r->join_inst, static_cast<size_t>(ps.join_slots), -1);
  // (no service whose instance depends on the request's history, no held thread: not read)
  if (need_sticky_) Reset(r->sticky, m_.services.size(), -1);
  if (need_held_) Reset(r->held, m_.services.size(), -1);
  ++live_requests_;
  ++issued_;
  if (r->measured) ++issued_measured_;
  Spawn(r, ps.root, -1, now_, -1);
}

void Sim::Spawn(Request* r, int node, int from_machine, double now, int copy) {
  const NodeRt& nr = node_rt_[static_cast<size_t>(r->path)][static_cast<size_t>(node)];
  const NodeSpec& n = *nr.spec;
  if (n.join > 1) {
    const size_t slot = static_cast<size_t>(n.join_slot);
    if (r->join_inst[slot] < 0) {
      if (nr.by_conn) {
        r->join_inst[slot] = nr.base + r->conn % nr.ninst;  // Route's answer, the sticky one's
      } else {
        const int sticky = r->sticky[static_cast<size_t>(n.service)];
        r->join_inst[slot] = sticky >= 0 ? sticky : Route(r, n.service);
      }
    }
    const int inst = r->join_inst[slot];
    const double t = now + Latency(from_machine, inst_[static_cast<size_t>(inst)].machine);
    r->join_time[slot] = std::max(r->join_time[slot], t);
    if (++r->join_count[slot] < n.join) return;
    Job* j = job_pool_.Get();
    *j = Job{r, node, 0, inst, r->conn, -1};
    j->spec = &n;
    j->rt = &nr;
    if (!nr.by_conn) r->sticky[static_cast<size_t>(n.service)] = inst;
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
  Job* j = job_pool_.Get();
  ++r->tokens;
  ++live_jobs_;
  Place(j, r, nr, from_machine, now, copy);
}

// A node with neither join nor fan-out copies: its instance (PlaceInst), the job set up on it (a
// fresh one from Spawn) and delivered: at once if it arrives now, else through an arrival event.
// (FinishNode does the same inline for a job it hands on.)
inline void Sim::Place(Job* j, Request* r, const NodeRt& cn, int from_machine, double now, int copy) {
  const int inst = PlaceInst(r, cn, copy);
  *j = Job{r, cn.node, 0, inst, r->conn, copy};
  j->spec = cn.spec;
  j->rt = &cn;
  const double lat = HopNs(from_machine, inst_machine_[static_cast<size_t>(inst)]);
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
  if (j->pos == 0 && j->rt->plain) {  // no pool (so not pooled), no thread to release
    j->node_arrival = now_;
    if (in.lindley) {
      FinishNode(j, Lindley(j, in));
      return;
    }
  } else {
    Enqueue2(j, r, n, in);
    return;
  }
  EnqueueQ(j, n, in);
}

// Enqueue's general case: a node's first stage with a connection pool or a held thread to
// release, or a later stage
void Sim::Enqueue2(Job* j, Request* r, const NodeSpec& n, Instance& in) {
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
    FinishNode(j, Lindley(j, in));
    return;
  }
  EnqueueQ(j, n, in);
}

// The job into its stage's queue, a thread woken for it
inline void Sim::EnqueueQ(Job* j, const NodeSpec& n, Instance& in) {
  const int s = n.stages[static_cast<size_t>(j->pos)];
  StageQ& q = in.queues[static_cast<size_t>(s)];
  // Straight to an idle thread (the compiled visit's common case, docs/qsim.md "2026-11-29
  // night"): no job queued on the instance, no thread being woken, the wake-up not deferred and
  // the core MakeRunnable would pick free. Through the queue, Wake wakes exactly one thread
  // (the last idle one), MakeRunnable grants it that core and StartWork finds this job alone in
  // the instance's queues and takes it; this does the same without the queue: its accounting
  // folded as in Fuse (length 0 -> 1 -> 0 at this instant: the last change's time and the
  // maximum), the waking count back where it was, the same service-time draw and completion
  // event from RunBatch. Results byte-identical (tests: Reproducible.*, Fusion.*; the model key
  // no_stage_fusion, every stage change through the queues, turns it off too).
  if (in.direct && in.pending == 0 && in.waking == 0 && !in.idle.empty()) {
    const int tid = in.idle.back();
    Thread& t = threads_[static_cast<size_t>(tid)];
    const ServiceSpec& sv = *in.sv;
    int core = -1;
    bool ok = t.private_job == nullptr;
    if (!sv.simple && ok) {
      MachineRt& mc = machines_[static_cast<size_t>(in.machine)];
      if (sv.pinned) {
        const int c = in.cores[static_cast<size_t>(t.index) % in.cores.size()];
        if (!mc.cores[static_cast<size_t>(c)].busy) core = c;
      } else {
        for (int c : in.cores)
          if (!mc.cores[static_cast<size_t>(c)].busy) {
            core = c;
            break;
          }
      }
      if (core >= 0) {
        mc.cores[static_cast<size_t>(core)].busy = true;
        t.core = core;
      } else {
        ok = false;  // it would wait on the run queue: the general path
      }
    }
    if (ok) {
      in.idle.pop_back();
      t.idle = false;
      t.batch.clear();
      t.batch_stage = s;
      t.batch.push_back(j);
      q.last = now_;
      if (q.max_len < 1) q.max_len = 1;
      ++in.outstanding;
      RunBatch(tid, t, in, sv);
      return;
    }
  }
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

double Sim::ServiceTimeGeneral(const StageSpec& st, const ServiceSpec& sv, size_t n, Rng& rng) {
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
  return ScaleTime(total, st, sv);
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
  RunBatch(tid, t, in, sv);
}

// The thread runs its batch (t.batch at stage t.batch_stage): the service time, a context
// switch if another thread ran on its core last, its completion event.
// Inlined into both callers: a call here cost ~10 % more instructions in StartWork on the
// imported fan-out, where no stage is fused.
[[gnu::always_inline]] inline void Sim::RunBatch(int tid, Thread& t, Instance& in, const ServiceSpec& sv) {
  const StageSpec& st = sv.stages[static_cast<size_t>(t.batch_stage)];
  double d = ServiceTime(st, sv, t.batch.size(), in.queues[static_cast<size_t>(t.batch_stage)].rng);
  if (t.core >= 0) {
    Core& c = machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(t.core)];
    if (c.last_thread != tid && c.last_thread != -1) d += sv.context_switch_us * 1000.0;
    c.last_thread = tid;
  }
  t.start = now_;
  ++stage_runs_;
  jobs_run_ += t.batch.size();
  const double end = now_ + d;
  Push(in.chain && t.batch.size() == 1 ? Chain(t, in, sv, end) : end, kDone, tid);
}

// A chain (docs/qsim.md "Engine", **chained stages**): on an instance with one thread whose cores
// no other thread may use (in.chain), a job's next stage fuses at the end of this one (Sim::Fuse)
// exactly when, at that time, its queue and every later one are empty; only this thread fills a
// queue past the instance's entry stages (in.max_entry) and it is busy until then, so whether
// each fusion will happen is known now. Their service times are drawn now, from the stages' own
// instance streams (the same values as later, in the same order), and the thread gets one
// completion event at the chain's end instead of one per stage; ChainSteps replays the stage
// changes' bookkeeping at their own times. Returns the chain's end.
double Sim::Chain(Thread& t, Instance& in, const ServiceSpec& sv, double end) {
  const Job* j = t.batch[0];
  const NodeSpec& n = *j->spec;
  // no job queued on the instance (in.pending counts the jobs in all its stage queues): every
  // queue is empty, no scan needed (the common case below saturation; the scan's varying trip
  // count cost branch mispredictions)
  const bool none_queued = in.pending == 0;
  int k = 0;
  for (size_t p = static_cast<size_t>(j->pos) + 1; p < n.stages.size() && k < kMaxChain; ++p, ++k) {
    const int s = n.stages[p];
    if (s <= in.max_entry) break;
    if (!none_queued)
      for (size_t q = static_cast<size_t>(s); q < in.queues.size(); ++q)
        if (in.queues[q].len != 0) goto done;
    t.chain_t[k] = end;
    t.chain_stage[k] = s;
    end = end + ServiceTime(sv.stages[static_cast<size_t>(s)], sv, 1, in.queues[static_cast<size_t>(s)].rng);
  }
done:
  t.chain_n = k;
  return end;
}

// The stage changes of the thread's chain at or before `upto`, as Done and Fuse would have made
// them at their own times: the finished stage's busy time, the job's position, the next queue's
// last change and maximum (its length went 0 -> 1 -> 0 at that instant), the run counters.
double Sim::ChainSteps(Thread& t, Instance& in, double upto) {
  Job* j = t.batch[0];
  int k = 0;
  for (; k < t.chain_n && t.chain_t[k] <= upto; ++k) {
    const double ti = t.chain_t[k];
    const double busy = ti - std::max(t.start, measure_start_);
    if (busy > 0) {
      t.busy_time += busy;
      if (t.core >= 0) machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(t.core)].busy_time += busy;
    }
    ++j->pos;
    StageQ& q = in.queues[static_cast<size_t>(t.chain_stage[k])];
    q.last = std::max(q.last, ti);  // a warm-up after ti set it later
    if (q.max_len < 1 && ti >= measure_start_) q.max_len = 1;  // (one before it was reset)
    t.batch_stage = t.chain_stage[k];
    t.start = ti;
    ++stage_runs_;
    ++jobs_run_;
  }
  // the rest (after `upto`) moves to the front
  for (int i = k; i < t.chain_n; ++i) {
    t.chain_t[i - k] = t.chain_t[i];
    t.chain_stage[i - k] = t.chain_stage[i];
  }
  t.chain_n -= k;
  return k > 0 ? t.start : -1.0;
}

// The run ended with chains under way: their stage changes the loop would have reached, as
// events of their own, happen here (those up to the end of the simulated time when it was
// reached, else those before the event that stopped the run), and the clock moves to the
// latest of them as it would have.
void Sim::EndChains() {
  const bool to_end = stop_reason_ == "duration reached";
  const double upto = to_end ? end_ : now_;
  for (Thread& t : threads_) {
    if (t.chain_n == 0) continue;
    const double last = ChainSteps(t, inst_[static_cast<size_t>(t.inst)], upto);
    if (to_end) now_ = std::max(now_, last);
  }
}

// Whether a runnable thread on the machine's run queue may use this core.
bool Sim::SomeoneWaits(const MachineRt& mc, int core) const {
  for (int w : mc.runq) {
    const Thread& wt = threads_[static_cast<size_t>(w)];
    const Instance& wi = inst_[static_cast<size_t>(wt.inst)];
    if (m_.services[static_cast<size_t>(wi.service)].pinned
            ? wi.cores[static_cast<size_t>(wt.index) % wi.cores.size()] == core
            : std::find(wi.cores.begin(), wi.cores.end(), core) != wi.cores.end())
      return true;
  }
  return false;
}

// Stage fusion (docs/qsim.md "Engine"): a thread finishes one job's stage, and the job's node
// continues with the next stage on the same instance. Through the queues, Done would enqueue
// the job there and StartWork take it straight back; this does the same without the queue
// whenever the result is certain to be the same: no idle thread in the instance (Wake would
// hand the job to it), the next stage's queue and every later one empty (StartWork takes the
// latest non-empty stage, then its queue's front: the job itself, alone, whatever the queue
// kind and batch limit), and the thread keeps running (after the enqueue more jobs pending than
// threads waking, no runnable thread waiting for its core). The queue's accounting is kept
// (length +1 then -1 at this instant: its area, last change and maximum), the instance's
// pending and outstanding counts come out unchanged, the service time is drawn at the same
// point from the same stream and no event is added or removed: every figure of the result is
// the same bit for bit (tests: Fusion.*, Reproducible.PinnedFigures).
bool Sim::Fuse(int tid, Thread& t, Instance& in) {
  if (!in.idle.empty() || in.pending + 1 <= static_cast<size_t>(in.waking)) return false;
  Job* j = t.batch[0];
  const size_t s = static_cast<size_t>(j->spec->stages[static_cast<size_t>(j->pos) + 1]);
  if (in.pending != 0)  // else every queue is empty (in.pending counts the jobs in them)
    for (size_t k = s; k < in.queues.size(); ++k)
      if (in.queues[k].len != 0) return false;
  if (t.core >= 0) {
    const MachineRt& mc = machines_[static_cast<size_t>(in.machine)];
    if (!mc.runq.empty() && SomeoneWaits(mc, t.core)) return false;
  }
  ++j->pos;
  // QueueChange(q, +1) then QueueChange(q, -1) at this instant, folded: the queue was empty, so
  // the first adds 0 x (its elapsed time) to the area and the second 1 x 0; what is left is the
  // last change's time and the maximum length
  StageQ& q = in.queues[s];
  q.last = now_;
  if (q.max_len < 1) q.max_len = 1;
  t.batch_stage = static_cast<int>(s);
  RunBatch(tid, t, in, m_.services[static_cast<size_t>(in.service)]);
  return true;
}

void Sim::ReleaseCore(int tid) {
  Thread& t = threads_[static_cast<size_t>(tid)];
  const Instance& in = inst_[static_cast<size_t>(t.inst)];
  MachineRt& mc = machines_[static_cast<size_t>(in.machine)];
  const int core = t.core;
  mc.cores[static_cast<size_t>(core)].busy = false;
  t.core = -1;
  if (mc.runq.empty()) return;
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
  if (t.chain_n > 0) ChainSteps(t, in, now_);
  const double busy = now_ - std::max(t.start, measure_start_);
  if (busy > 0) {
    t.busy_time += busy;
    if (t.core >= 0) machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(t.core)].busy_time += busy;
  }
  if (t.batch.size() > 1 &&
      m_.services[static_cast<size_t>(in.service)].stages[static_cast<size_t>(t.batch_stage)].handoff_uqsim)
    UqsimHandoff(t.batch);
  if (t.batch.size() == 1 && static_cast<size_t>(t.batch[0]->pos) + 1 < t.batch[0]->spec->stages.size() &&
      !m_.no_stage_fusion && Fuse(tid, t, in))
    return;
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
    if (mc.runq.empty() || !SomeoneWaits(mc, t.core)) {
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

// A node finished at time t (now, or later for a Lindley instance, see below). A loop, not a
// recursion (the compiled path, docs/qsim.md "2026-11-29 night"): a job handed on to its only
// child that arrives at once at a Lindley instance is served there (its departure computed) and
// that node finishes in the next turn, in the order the calls FinishNode -> Place -> Enqueue ->
// Lindley -> FinishNode made before.
void Sim::FinishNode(Job* j, double t) {
  for (;;) {
    Request* r = j->req;
    const NodeRt& nr = *j->rt;
    const NodeSpec& n = *nr.spec;
    if (r->measured) svc_hist_[static_cast<size_t>(nr.service)].Record(static_cast<int64_t>(t - j->node_arrival));
    if (!win_svc_.empty()) win_svc_[static_cast<size_t>(nr.service)].Record(static_cast<int64_t>(t - j->node_arrival));
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
    const int machine = inst_machine_[static_cast<size_t>(j->inst)];
    const NodeRt* next = nr.only;  // the child the job is handed on to, if one
    if (next == nullptr) {
      if (!n.children.empty()) {
        int only = -1;  // the one child this node starts, if one
        if (n.branch == Branch::kAll) {
          if (n.children.size() == 1) only = n.children[0];
          else
            for (int c : n.children) Spawn(r, c, machine, t, j->copy);
        } else {
          const double u = rng_branch_.Uniform();
          size_t k = 0;
          while (k + 1 < n.child_cdf.size() && u >= n.child_cdf[k]) ++k;
          only = n.children[k];
        }
        if (only >= 0) {
          const NodeRt& cn = node_rt_[static_cast<size_t>(r->path)][static_cast<size_t>(only)];
          if (cn.spec->join <= 1 && cn.spec->copies <= 1) next = &cn;
          else Spawn(r, only, machine, t, j->copy);
        }
      } else {
        r->done = std::max(r->done, t);  // a leaf of the tree: it answers the client
      }
    }
    if (next != nullptr) {
      // The job goes on as its only child's: no pool round trip, the request's token and the
      // live-job count handed over (what Spawn's ++ and this function's -- would net to).
      // Nothing below may touch r after the delivery: the child may finish the request at once.
      // (Place, inline: the instance, the job set up on it, its delivery.)
      const NodeRt& cn = *next;
      const int copy = j->copy;
      const int inst = PlaceInst(r, cn, copy);
      *j = Job{r, cn.node, 0, inst, r->conn, copy};
      j->spec = cn.spec;
      j->rt = &cn;
      const double lat = HopNs(machine, inst_machine_[static_cast<size_t>(inst)]);
      if (lat == 0 && t == now_) {  // same instant: no event needed
        Instance& in = inst_[static_cast<size_t>(inst)];
        if (cn.plain && in.lindley) {  // Enqueue's case for it: served on arrival
          j->node_arrival = now_;
          t = Lindley(j, in);
          continue;  // FinishNode(j, t)
        }
        Enqueue(j);
      } else {
        Push(t + lat, kJobArrive, 0, 0, j);
      }
      return;
    }
    job_pool_.Put(j);
    --live_jobs_;
    if (--r->tokens == 0) Complete(r);
    return;
  }
}

// The fast path for an instance that is first-come-first-served servers (every stage fifo with
// batch 1, every node on it one stage, its threads with simple execution or each with a core
// that no other instance's thread may take): the job's departure is known when it arrives
// (Lindley's recursion, d = max(a, d_prev) + s; with c threads, Kiefer and Wolfowitz's: the
// job starts when the first of the c is free), so it needs no event of its own. Arrivals reach
// an instance in time order and the event path starts jobs in that order, drawing their times
// from the instance's stream in the same order, so this is exact. Jobs are served in arrival
// order whatever their stage (the event path would take a later stage's job first when several
// wait: a network stack's rx before its tx); the queue-length figures come from Little's law
// (waiting time / window).
[[gnu::always_inline]] inline double Sim::Lindley(Job* j, Instance& in) {
  const ServiceSpec& sv = *in.sv;
  const NodeRt& nr = *j->rt;
  const int stage = nr.stage;
  size_t k = 0;  // the thread free first (the lowest-numbered of those free now)
  const size_t c = in.free_at_k.size();
  double* free_at = &in.free_at;
  if (c > 1) {
    for (size_t i = 1; i < c; ++i)
      if (in.free_at_k[i] < in.free_at_k[k]) k = i;
    free_at = &in.free_at_k[k];
  }
  const double start = std::max(now_, *free_at);
  StageQ& q = in.queues[static_cast<size_t>(stage)];
  // ServiceTime's exponential case without a size table, its operations in its order
  const double d = nr.exp1 ? ScaleTime(0.0 + q.rng.Exp(nr.mean1), *nr.st, sv) : ServiceTime(*nr.st, sv, 1, q.rng);
  const double dep = start + d;
  *free_at = dep;
  // the backlog is in the free times, not in live requests: bound it the same way
  const double backlog = (start - now_) / nr.backlog_mean_ns * static_cast<double>(c);
  if (backlog > static_cast<double>(m_.max_live_requests))
    Stop("a backlog of more than " + std::to_string(m_.max_live_requests) + " jobs at " + sv.name, true);
  const double b = std::min(dep, end_) - std::max(start, measure_start_);
  if (b > 0) {
    // thread k on core k of the instance's (the event path puts a woken thread on the first
    // free core: the per-core split may differ, the machine's total does not)
    if (k == 0) {
      *in.busy_thread0 += b;
      if (in.busy_core0 != nullptr) *in.busy_core0 += b;
    } else {
      threads_[static_cast<size_t>(in.first_thread) + k].busy_time += b;
      if (!sv.simple) machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(in.cores[k])].busy_time += b;
    }
  }
  if (now_ >= measure_start_) {
    q.area += start - now_;
    if (start > now_ && q.max_len == 0) q.max_len = 1;
  }
  ++stage_runs_;
  ++jobs_run_;
  return dep;  // the caller finishes the node at dep (FinishNode)
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

void Sim::Loop() {
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
          *j = Job{r, ev.a, 0, base + copy % ninst, r->conn, copy};
          j->spec = &n;
          j->rt = &node_rt_[static_cast<size_t>(r->path)][static_cast<size_t>(ev.a)];
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
  EndChains();
}

}  // namespace musku::qsim::internal
