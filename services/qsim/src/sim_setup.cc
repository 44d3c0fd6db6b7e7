// Building a run: the random streams, the path choice, machines, instances and their threads,
// the Lindley fast path's eligibility, the first events (docs/qsim.md "Engine").
#include "sim.h"

#include <algorithm>
#include <string>
#include <utility>

namespace musku::qsim::internal {

void Sim::Setup() {
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
  // which services are first-come-first-served servers (the Lindley fast path): every stage fifo
  // with batch 1, every node one stage, and (per instance, below) a core for each thread that no
  // other instance's thread may take
  std::vector<bool> lindley(m_.services.size(), false);
  for (size_t s = 0; s < m_.services.size(); ++s) {
    const ServiceSpec& sv = m_.services[s];
    bool ok = sv.lb != Lb::kLeastLoaded && !m_.no_fast_path;
    for (const StageSpec& st : sv.stages) ok = ok && st.queue == QueueKind::kFifo && st.batch == 1;
    lindley[s] = ok;
  }
  for (const PathSpec& p : m_.paths)
    for (const NodeSpec& n : p.nodes)
      if (n.stages.size() != 1 || n.hold_thread || n.release_thread || n.pool > 0)
        lindley[static_cast<size_t>(n.service)] = false;
  pools_.assign(static_cast<size_t>(m_.pools), PoolRt());
  // chained stages (Sim::Chain): the stages a job enters each service at; and (there and for
  // the Lindley fast path) which cores more than one instance's threads may run on (simple
  // execution takes no core)
  std::vector<int> max_entry(m_.services.size(), 0);
  for (const PathSpec& p : m_.paths)
    for (const NodeSpec& n : p.nodes)
      if (!n.stages.empty())
        max_entry[static_cast<size_t>(n.service)] = std::max(max_entry[static_cast<size_t>(n.service)], n.stages[0]);
  std::vector<std::vector<int>> core_users(m_.machines.size());
  for (size_t i = 0; i < m_.machines.size(); ++i) core_users[i].assign(static_cast<size_t>(m_.machines[i].cores), 0);
  for (const ServiceSpec& sv : m_.services)
    if (!sv.simple)
      for (const InstanceSpec& is : sv.instances)
        for (int c : is.cores) core_users[static_cast<size_t>(is.machine)][static_cast<size_t>(c)] += 1;
  uint64_t stream = kStreamStage;
  for (size_t s = 0; s < m_.services.size(); ++s) {
    const ServiceSpec& sv = m_.services[s];
    svc_first_inst_.push_back(static_cast<int>(inst_.size()));
    for (const InstanceSpec& is : sv.instances) {
      Instance in;
      in.service = static_cast<int>(s);
      in.machine = is.machine;
      in.cores = is.cores;
      in.queues.resize(sv.stages.size());
      for (const StageSpec& st : sv.stages) in.defer_wake = in.defer_wake || st.batch > 1;
      in.max_entry = max_entry[s];
      in.direct = !in.defer_wake && !m_.no_stage_fusion;
      bool own_cores = true;
      for (int c : is.cores) own_cores = own_cores && core_users[static_cast<size_t>(is.machine)][static_cast<size_t>(c)] == 1;
      in.lindley = lindley[s] && (sv.simple || (own_cores && is.cores.size() >= static_cast<size_t>(sv.threads)));
      if (in.lindley) in.free_at_k.assign(static_cast<size_t>(sv.threads), 0.0);
      in.chain = !m_.no_stage_fusion && control_ == nullptr && sv.threads == 1 && !in.lindley && (sv.simple || own_cores);
      for (size_t k = 0; k < sv.stages.size(); ++k) {
        in.queues[k].kind = sv.stages[k].queue;
        // one stream per (instance, stage): an instance's draws do not depend on the order in
        // which the engine serves other instances of its service
        in.queues[k].rng = Rng(DeriveSeed(m_.seed, stream++));
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
  // the compiled path (NodeRt): per node, what a visit would otherwise look up or decide per job
  for (Instance& in : inst_) {
    in.sv = &m_.services[static_cast<size_t>(in.service)];
    inst_machine_.push_back(in.machine);
    if (in.lindley) {
      in.busy_thread0 = &threads_[static_cast<size_t>(in.first_thread)].busy_time;
      if (!in.sv->simple)
        in.busy_core0 = &machines_[static_cast<size_t>(in.machine)].cores[static_cast<size_t>(in.cores[0])].busy_time;
    }
  }
  client_ns_ = Latency(-1, 0);
  local_ns_ = Latency(0, 0);
  net_ns_ = Latency(0, 1);
  node_rt_.resize(m_.paths.size());
  for (size_t p = 0; p < m_.paths.size(); ++p) node_rt_[p].resize(m_.paths[p].nodes.size());
  for (size_t p = 0; p < m_.paths.size(); ++p) {
    const std::vector<NodeSpec>& nodes = m_.paths[p].nodes;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const NodeSpec& n = nodes[i];
      const ServiceSpec& sv = m_.services[static_cast<size_t>(n.service)];
      NodeRt& nr = node_rt_[p][i];
      nr.spec = &n;
      nr.node = static_cast<int>(i);
      nr.service = n.service;
      nr.base = svc_first_inst_[static_cast<size_t>(n.service)];
      nr.ninst = static_cast<int>(sv.instances.size());
      nr.by_conn = sv.lb == Lb::kConnection || nr.ninst == 1;
      need_sticky_ = need_sticky_ || !nr.by_conn;
      need_held_ = need_held_ || n.hold_thread || n.release_thread;
      nr.plain = n.pool == 0 && !n.release_thread;
      if (n.branch == Branch::kAll && n.children.size() == 1) {
        const NodeSpec& c = nodes[static_cast<size_t>(n.children[0])];
        if (c.join <= 1 && c.copies <= 1) nr.only = &node_rt_[p][static_cast<size_t>(n.children[0])];
      }
      nr.stage = n.stages[0];
      nr.st = &sv.stages[static_cast<size_t>(nr.stage)];
      nr.exp1 = nr.st->dist == Dist::kExp && nr.st->table_bytes.empty();
      // ServiceTime's mean for a batch of one, the same expression (the same value)
      nr.mean1 = nr.st->mean_us + nr.st->per_job_us * static_cast<double>(size_t{1} - 1);
      nr.backlog_mean_ns = std::max(1.0, nr.st->mean_us * 1000.0);
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

}

}  // namespace musku::qsim::internal
