// Parsing the normalised model JSON. The Python side has already validated the user's file and
// reported errors with file:line; here every field is still checked so that a malformed document
// is refused with one clear message (ModelError) instead of undefined behaviour.
#include <cmath>
#include <string>

#include "engine.h"

namespace musku::qsim {
namespace {

using nlohmann::json;

[[noreturn]] void Fail(const std::string& where, const std::string& what) {
  throw ModelError(where + ": " + what);
}

const json& Need(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) Fail(where, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) Fail(where, std::string("missing '") + key + "'");
  return *it;
}

double Num(const json& j, const char* key, const std::string& where, double def, bool required,
           double lo, bool lo_open = false) {
  if (!j.is_object()) Fail(where, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) Fail(where, std::string("missing '") + key + "'");
    return def;
  }
  if (!it->is_number()) Fail(where + "." + key, "expected a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || (lo_open && v == lo)) {
    Fail(where + "." + key, std::string("must be ") + (lo_open ? "> " : ">= ") +
                                std::to_string(lo) + ", got " + std::to_string(v));
  }
  return v;
}

int Int(const json& j, const char* key, const std::string& where, int def, bool required, int lo,
        int hi = 1 << 30) {
  const double v = Num(j, key, where, def, required, lo);
  if (v != std::floor(v) || v > hi) Fail(where + "." + key, "must be an integer <= " + std::to_string(hi));
  return static_cast<int>(v);
}

std::string Str(const json& j, const char* key, const std::string& where, const std::string& def) {
  auto it = j.find(key);
  if (it == j.end()) return def;
  if (!it->is_string()) Fail(where + "." + key, "expected a string");
  return it->get<std::string>();
}

bool Bool(const json& j, const char* key, const std::string& where, bool def) {
  auto it = j.find(key);
  if (it == j.end()) return def;
  if (!it->is_boolean()) Fail(where + "." + key, "expected true or false");
  return it->get<bool>();
}

const json& Arr(const json& j, const char* key, const std::string& where, bool required) {
  static const json kEmpty = json::array();
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) Fail(where, std::string("missing '") + key + "'");
    return kEmpty;
  }
  if (!it->is_array()) Fail(where + "." + key, "expected an array");
  return *it;
}

StageSpec ParseStage(const json& j, const std::string& w) {
  StageSpec s;
  s.name = Str(j, "name", w, "stage");
  const std::string q = Str(j, "queue", w, "fifo");
  if (q == "fifo") s.queue = QueueKind::kFifo;
  else if (q == "epoll") s.queue = QueueKind::kEpoll;
  else if (q == "socket") s.queue = QueueKind::kSocket;
  else Fail(w + ".queue", "unknown queue kind '" + q + "' (fifo, epoll, socket)");
  s.batch = Int(j, "batch", w, 1, false, 1);
  const std::string d = Str(j, "dist", w, "exp");
  if (d == "exp") s.dist = Dist::kExp;
  else if (d == "const") s.dist = Dist::kConst;
  else if (d == "lognormal") s.dist = Dist::kLognormal;
  else if (d == "empirical") s.dist = Dist::kEmpirical;
  else Fail(w + ".dist", "unknown distribution '" + d + "' (exp, const, lognormal, empirical)");
  s.mean_us = Num(j, "mean_us", w, 1, true, 0);
  s.per_job_us = Num(j, "per_job_us", w, 0, false, 0);
  s.sigma = Num(j, "sigma", w, 0, false, 0);
  s.dvfs_scale = Num(j, "dvfs_scale", w, 0, false, 0);
  if (s.dvfs_scale > 1) Fail(w + ".dvfs_scale", "must be <= 1");
  if (s.dist == Dist::kEmpirical) {
    const json& e = Arr(j, "empirical", w, true);
    if (e.empty()) Fail(w + ".empirical", "empty histogram");
    double total = 0, sum = 0;
    for (const json& row : e) {
      if (!row.is_array() || row.size() != 2 || !row[0].is_number() || !row[1].is_number())
        Fail(w + ".empirical", "rows are [value_us, weight]");
      const double v = row[0].get<double>(), wt = row[1].get<double>();
      if (!(v >= 0) || !(wt >= 0) || !std::isfinite(v) || !std::isfinite(wt))
        Fail(w + ".empirical", "values and weights must be finite and >= 0");
      total += wt;
      sum += v * wt;
      s.emp_values_us.push_back(v);
      s.emp_cdf.push_back(total);
    }
    if (!(total > 0)) Fail(w + ".empirical", "weights sum to zero");
    for (double& c : s.emp_cdf) c /= total;
    s.emp_mean_us = sum / total;
  }
  s.bytes_per_job = Num(j, "bytes_per_job", w, 0, false, 0);
  const json& t = Arr(j, "bytes_table", w, false);
  for (const json& row : t) {
    if (!row.is_array() || row.size() != 2 || !row[0].is_number() || !row[1].is_number())
      Fail(w + ".bytes_table", "rows are [bytes, mean_us]");
    const double b = row[0].get<double>();
    if (!(b > 0) || (!s.table_bytes.empty() && b <= s.table_bytes.back()))
      Fail(w + ".bytes_table", "byte thresholds must be positive and increasing");
    s.table_bytes.push_back(b);
    s.table_us.push_back(row[1].get<double>());
  }
  if (!s.table_bytes.empty() && !(s.bytes_per_job > 0))
    Fail(w + ".bytes_per_job", "a bytes_table needs bytes_per_job > 0");
  const std::string h = Str(j, "handoff", w, "in_order");
  if (h == "uqsim") s.handoff_uqsim = true;
  else if (h != "in_order") Fail(w + ".handoff", "unknown handoff '" + h + "' (in_order, uqsim)");
  return s;
}

// NodeSpec::reply: a node is a reply visit when one of its ancestors runs on the same service
// (the request comes back to a service it passed through: μqSim's WAIT_RESP record). Nodes
// are topologically sorted, so one forward pass carries each node's ancestors' services.
void MarkReplies(PathSpec& ps, size_t services) {
  std::vector<std::vector<char>> above(ps.nodes.size(), std::vector<char>(services, 0));
  for (size_t k = 0; k < ps.nodes.size(); ++k) {
    NodeSpec& n = ps.nodes[k];
    const auto svc = static_cast<size_t>(n.service);
    n.reply = above[k][svc] != 0;
    for (int c : n.children) {
      std::vector<char>& dst = above[static_cast<size_t>(c)];
      for (size_t s = 0; s < services; ++s) dst[s] = static_cast<char>(dst[s] | above[k][s]);
      dst[svc] = 1;
    }
  }
}

}  // namespace

Model ParseModel(const json& j) {
  Model m;
  if (!j.is_object()) Fail("model", "expected a JSON object");
  const double seed = Num(j, "seed", "model", 1, false, 0);
  m.seed = static_cast<uint64_t>(seed);
  m.duration_s = Num(j, "duration_s", "model", 1, true, 0, true);
  m.warmup_s = Num(j, "warmup_s", "model", 0, false, 0);
  if (m.warmup_s >= m.duration_s) Fail("model.warmup_s", "must be shorter than duration_s");
  m.max_requests = static_cast<uint64_t>(Num(j, "max_requests", "model", 0, false, 0));
  m.max_live_requests = static_cast<uint64_t>(Num(j, "max_live_requests", "model", 100000, false, 1));
  m.max_live_jobs = static_cast<uint64_t>(Num(j, "max_live_jobs", "model", 4000000, false, 1));
  m.net_latency_us = Num(j, "net_latency_us", "model", 0, false, 0);
  m.no_fast_path = Bool(j, "no_fast_path", "model", false);
  m.no_stage_fusion = Bool(j, "no_stage_fusion", "model", false);
  m.control_interval_s = Num(j, "control_interval_s", "model", 0, false, 0);
  m.local_latency_us = Num(j, "local_latency_us", "model", 0, false, 0);
  m.client_latency_us = Num(j, "client_latency_us", "model", m.net_latency_us, false, 0);
  m.reply_latency_us = Num(j, "reply_latency_us", "model", m.net_latency_us, false, 0);

  const json& machines = Arr(j, "machines", "model", true);
  if (machines.empty()) Fail("model.machines", "no machines");
  for (size_t i = 0; i < machines.size(); ++i) {
    const std::string w = "machines[" + std::to_string(i) + "]";
    MachineSpec ms;
    ms.name = Str(machines[i], "name", w, "m" + std::to_string(i));
    ms.cores = Int(machines[i], "cores", w, 1, true, 1, 4096);
    m.machines.push_back(ms);
  }

  const json& services = Arr(j, "services", "model", true);
  if (services.empty()) Fail("model.services", "no services");
  for (size_t i = 0; i < services.size(); ++i) {
    const std::string w = "services[" + std::to_string(i) + "]";
    const json& sj = services[i];
    ServiceSpec s;
    s.name = Str(sj, "name", w, "s" + std::to_string(i));
    const std::string ex = Str(sj, "execution", w, "threads");
    if (ex == "simple") s.simple = true;
    else if (ex == "pinned") s.pinned = true;
    else if (ex != "threads") Fail(w + ".execution", "unknown execution '" + ex + "' (simple, threads, pinned)");
    s.threads = Int(sj, "threads", w, 1, false, 1, 1 << 20);
    s.context_switch_us = Num(sj, "context_switch_us", w, 0, false, 0);
    s.freq_ratio = Num(sj, "freq_ratio", w, 1, false, 0, true);
    s.time_scale = Num(sj, "time_scale", w, 1, false, 0, true);
    s.connections = Int(sj, "connections", w, 1, false, 1, 1 << 20);
    const std::string lb = Str(sj, "lb", w, "round_robin");
    if (lb == "round_robin") s.lb = Lb::kRoundRobin;
    else if (lb == "random") s.lb = Lb::kRandom;
    else if (lb == "least_loaded") s.lb = Lb::kLeastLoaded;
    else if (lb == "connection") s.lb = Lb::kConnection;
    else Fail(w + ".lb", "unknown load balancer '" + lb + "'");
    const json& st = Arr(sj, "stages", w, true);
    if (st.empty()) Fail(w + ".stages", "a service needs at least one stage");
    for (size_t k = 0; k < st.size(); ++k)
      s.stages.push_back(ParseStage(st[k], w + ".stages[" + std::to_string(k) + "]"));
    const json& inst = Arr(sj, "instances", w, true);
    if (inst.empty()) Fail(w + ".instances", "a service needs at least one instance");
    for (size_t k = 0; k < inst.size(); ++k) {
      const std::string wi = w + ".instances[" + std::to_string(k) + "]";
      InstanceSpec is;
      is.machine = Int(inst[k], "machine", wi, 0, true, 0, static_cast<int>(m.machines.size()) - 1);
      const int ncores = m.machines[static_cast<size_t>(is.machine)].cores;
      for (const json& c : Arr(inst[k], "cores", wi, !s.simple)) {
        if (!c.is_number_integer() || c.get<int>() < 0 || c.get<int>() >= ncores)
          Fail(wi + ".cores", "core ids must be integers in [0, " + std::to_string(ncores) + ")");
        is.cores.push_back(c.get<int>());
      }
      if (!s.simple && is.cores.empty()) Fail(wi + ".cores", "no cores");
      s.instances.push_back(is);
    }
    m.services.push_back(std::move(s));
  }

  const json& paths = Arr(j, "paths", "model", true);
  if (paths.empty()) Fail("model.paths", "no request paths");
  for (size_t p = 0; p < paths.size(); ++p) {
    const std::string w = "paths[" + std::to_string(p) + "]";
    PathSpec ps;
    ps.weight = Num(paths[p], "weight", w, 1, false, 0, true);
    const json& nodes = Arr(paths[p], "nodes", w, true);
    if (nodes.empty()) Fail(w + ".nodes", "no nodes");
    const int nn = static_cast<int>(nodes.size());
    ps.root = Int(paths[p], "root", w, 0, false, 0, nn - 1);
    for (int k = 0; k < nn; ++k) {
      const std::string wn = w + ".nodes[" + std::to_string(k) + "]";
      const json& nj = nodes[static_cast<size_t>(k)];
      NodeSpec n;
      n.service = Int(nj, "service", wn, 0, true, 0, static_cast<int>(m.services.size()) - 1);
      const int nst = static_cast<int>(m.services[static_cast<size_t>(n.service)].stages.size());
      for (const json& s : Arr(nj, "stages", wn, true)) {
        if (!s.is_number_integer() || s.get<int>() < 0 || s.get<int>() >= nst)
          Fail(wn + ".stages", "stage index out of range");
        n.stages.push_back(s.get<int>());
      }
      if (n.stages.empty()) Fail(wn + ".stages", "a node runs at least one stage");
      for (const json& c : Arr(nj, "children", wn, false)) {
        if (!c.is_number_integer() || c.get<int>() <= k || c.get<int>() >= nn)
          Fail(wn + ".children", "children must be later nodes (the path is topologically sorted)");
        n.children.push_back(c.get<int>());
      }
      const std::string br = Str(nj, "branch", wn, "all");
      if (br == "one") n.branch = Branch::kOne;
      else if (br != "all") Fail(wn + ".branch", "unknown branch '" + br + "' (all, one)");
      if (n.branch == Branch::kOne) {
        const json& wts = Arr(nj, "child_weights", wn, true);
        if (wts.size() != n.children.size()) Fail(wn + ".child_weights", "one weight per child");
        double total = 0;
        for (const json& x : wts) {
          if (!x.is_number() || !(x.get<double>() >= 0)) Fail(wn + ".child_weights", "weights must be >= 0");
          total += x.get<double>();
          n.child_cdf.push_back(total);
        }
        if (!(total > 0)) Fail(wn + ".child_weights", "weights sum to zero");
        for (double& c : n.child_cdf) c /= total;
      }
      n.copies = Int(nj, "copies", wn, 1, false, 1, 1 << 20);
      n.join = Int(nj, "join", wn, 1, false, 1, 1 << 30);
      n.hold_thread = Bool(nj, "hold_thread", wn, false);
      n.release_thread = Bool(nj, "release_thread", wn, false);
      n.pool = Int(nj, "pool", wn, 0, false, 0, 1 << 30);
      if (n.pool > 0) n.pool_slot = m.pools++;
      if (n.join > 1) n.join_slot = ps.join_slots++;
      ps.nodes.push_back(std::move(n));
    }
    // How many times each node runs per request (copies multiply along a chain until a join);
    // a join must be fed exactly that many arrivals, any other node by one parent.
    std::vector<long> feed(static_cast<size_t>(nn), 0), parents(static_cast<size_t>(nn), 0),
        mult(static_cast<size_t>(nn), 0);
    for (int k = 0; k < nn; ++k) {
      const NodeSpec& n = ps.nodes[static_cast<size_t>(k)];
      const std::string wn = w + ".nodes[" + std::to_string(k) + "]";
      if (k == ps.root) {
        if (parents[static_cast<size_t>(k)] != 0) Fail(w, "the root has parents");
        if (n.join != 1) Fail(w, "the root cannot be a join");
        mult[static_cast<size_t>(k)] = n.copies;
      } else if (parents[static_cast<size_t>(k)] == 0) {
        Fail(wn, "unreachable node");
      } else if (n.join > 1) {
        if (n.copies > 1) Fail(wn, "a join node cannot have copies");
        if (feed[static_cast<size_t>(k)] != n.join)
          Fail(wn + ".join", "waits for " + std::to_string(n.join) + " arrivals but its parents send " +
                                 std::to_string(feed[static_cast<size_t>(k)]) + ": it can never complete");
        mult[static_cast<size_t>(k)] = 1;
      } else {
        if (parents[static_cast<size_t>(k)] != 1) Fail(wn, "several parents but join = 1");
        mult[static_cast<size_t>(k)] = feed[static_cast<size_t>(k)] * n.copies;
      }
      for (int c : n.children) {
        feed[static_cast<size_t>(c)] += mult[static_cast<size_t>(k)];
        parents[static_cast<size_t>(c)] += 1;
      }
    }
    MarkReplies(ps, m.services.size());
    m.paths.push_back(std::move(ps));
  }

  const json& c = Need(j, "client", "model");
  const std::string w = "client";
  const std::string kind = Str(c, "kind", w, "open");
  m.client.connections = Int(c, "connections", w, 1, false, 1, 1 << 24);
  if (kind == "closed") {
    m.client.closed = true;
    m.client.users = Int(c, "users", w, 1, true, 1, 1 << 24);
    m.client.think_us = Num(c, "think_us", w, 0, false, 0);
  } else if (kind == "open") {
    const json& ep = Arr(c, "epochs", w, true);
    if (ep.empty()) Fail(w + ".epochs", "no epochs");
    double last = 0;
    for (size_t k = 0; k < ep.size(); ++k) {
      const std::string we = w + ".epochs[" + std::to_string(k) + "]";
      Epoch e;
      e.end_s = Num(ep[k], "end_s", we, 0, true, 0, true);
      e.qps = Num(ep[k], "qps", we, 0, true, 0, true);
      if (e.end_s <= last) Fail(we + ".end_s", "epoch ends must increase");
      last = e.end_s;
      m.client.epochs.push_back(e);
    }
  } else {
    Fail(w + ".kind", "unknown client kind '" + kind + "' (open, closed)");
  }
  return m;
}

}  // namespace musku::qsim
