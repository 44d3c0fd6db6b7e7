// The Admin service every musku server runs: Health, Stats, GetThreading, SetThreading.
#include "admin.h"

#include <sys/resource.h>

#include "admin.grpc.pb.h"

namespace musku::detail {
namespace {

void FillThreading(Engine* e, ThreadingState* s) {
  const Threading t = e->Current();
  s->set_model(t.model.Name());
  s->set_pollers(t.pools.pollers);
  s->set_workers(t.pools.workers);
  s->set_responders(t.pools.responders);
  s->set_auto_mode(e->auto_mode());
  s->set_measured_qps(e->MeasuredQps());
  s->set_table(e->table_path());
  s->set_max_pollers(e->opts().max_pools.pollers);
  s->set_max_workers(e->opts().max_pools.workers);
  s->set_max_responders(e->opts().max_pools.responders);
  s->set_switches(e->switches());
  s->set_last_error(e->last_error());
  s->set_leaf_transport(e->opts().leaf_transport == LeafTransport::kBatch ? "batch" : "unary");
  const int64_t now = MonotonicNs();
  for (const auto& r : e->RecentSwitches()) {
    SwitchEvent* ev = s->add_recent_switches();
    ev->set_age_s(static_cast<double>(now - r.at_ns) / 1e9);
    ev->set_from(r.from);
    ev->set_to(r.to);
    ev->set_reason(r.reason);
    ev->set_measured_qps(r.qps);
    ev->set_backlog(r.backlog);
  }
}

class HealthH final : public LeafHandler<HealthRequest, HealthReply> {
 public:
  explicit HealthH(Engine* e) : e_(e) {}
  grpc::Status Handle(const HealthRequest&, HealthReply* r) override {
    r->set_serving(true);
    r->set_service(e_->opts().service);
    r->set_role(e_->role() == Role::kLeaf ? "leaf" : "midtier");
    r->set_uptime_s(e_->UptimeS());
    return grpc::Status::OK;
  }
  Engine* e_;
};

class StatsH final : public LeafHandler<StatsRequest, StatsReply> {
 public:
  explicit StatsH(Engine* e) : e_(e) {}
  grpc::Status Handle(const StatsRequest& q, StatsReply* r) override {
    Engine::Snapshot s = e_->TakeStats(q.reset());
    r->set_requests(s.requests);
    r->set_errors(s.errors);
    r->set_leaf_errors(s.leaf_errors);
    r->set_qps_now(e_->MeasuredQps());
    r->set_window_s(s.window_s);
    r->set_qps_avg(s.window_s > 0 ? static_cast<double>(s.requests) / s.window_s : 0);
    auto* l = r->mutable_latency();
    l->set_p50_us(static_cast<double>(s.hist.Percentile(0.50)) / 1e3);
    l->set_p90_us(static_cast<double>(s.hist.Percentile(0.90)) / 1e3);
    l->set_p99_us(static_cast<double>(s.hist.Percentile(0.99)) / 1e3);
    l->set_p999_us(static_cast<double>(s.hist.Percentile(0.999)) / 1e3);
    l->set_max_us(static_cast<double>(s.hist.Max()) / 1e3);
    l->set_mean_us(s.hist.Mean() / 1e3);
    for (auto& [ub, c] : s.hist.Buckets()) {
      auto* b = r->add_buckets();
      b->set_upper_ns(ub);
      b->set_count(c);
    }
    for (int p = 0; p < kPhases; ++p) {
      const Histogram& h = s.phase_hist[p];
      if (h.Count() == 0) continue;
      auto* ph = r->add_phases();
      ph->set_name(Engine::kPhaseNames[p]);
      ph->set_count(h.Count());
      ph->set_mean_us(h.Mean() / 1e3);
      ph->set_cpu_mean_us(static_cast<double>(s.phase_cpu_ns[p]) / 1e3 / static_cast<double>(h.Count()));
      for (auto& [ub, c] : h.Buckets()) {
        auto* b = ph->add_buckets();
        b->set_upper_ns(ub);
        b->set_count(c);
      }
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    r->set_cpu_user_s(static_cast<double>(ru.ru_utime.tv_sec) + ru.ru_utime.tv_usec / 1e6);
    r->set_cpu_sys_s(static_cast<double>(ru.ru_stime.tv_sec) + ru.ru_stime.tv_usec / 1e6);
    r->set_uptime_s(e_->UptimeS());
    r->set_threads(static_cast<uint32_t>(e_->thread_count()));
    FillThreading(e_, r->mutable_threading());
    return grpc::Status::OK;
  }
  Engine* e_;
};

class GetThreadingH final : public LeafHandler<GetThreadingRequest, ThreadingState> {
 public:
  explicit GetThreadingH(Engine* e) : e_(e) {}
  grpc::Status Handle(const GetThreadingRequest&, ThreadingState* r) override {
    FillThreading(e_, r);
    return grpc::Status::OK;
  }
  Engine* e_;
};

class SetThreadingH final : public LeafHandler<SetThreadingRequest, ThreadingState> {
 public:
  explicit SetThreadingH(Engine* e) : e_(e) {}
  grpc::Status Handle(const SetThreadingRequest& q, ThreadingState* r) override {
    if (q.model() == "auto") {
      if (q.has_pollers() || q.has_workers() || q.has_responders())
        return {grpc::StatusCode::INVALID_ARGUMENT, "auto takes no pool sizes (the table sets them)"};
      if (std::string why = e_->SetAuto(q.table_path()); !why.empty())
        return {grpc::StatusCode::FAILED_PRECONDITION, why};
      FillThreading(e_, r);
      return grpc::Status::OK;
    }
    Threading t = e_->Current();
    if (!q.model().empty()) {
      auto m = ThreadingModel::Parse(q.model());
      if (!m) return {grpc::StatusCode::INVALID_ARGUMENT, "unknown threading model '" + q.model() + "'"};
      t.model = *m;
    }
    if (q.has_pollers()) t.pools.pollers = q.pollers();
    if (q.has_workers()) t.pools.workers = q.workers();
    else if (t.model.dispatch == DispatchMode::kDispatch && t.pools.workers < 1) t.pools.workers = 1;
    if (q.has_responders()) t.pools.responders = q.responders();
    else if (t.model.leaf == LeafCallMode::kAsync && !q.model().empty() &&
             e_->Current().model.leaf == LeafCallMode::kSync && t.pools.responders < 1)
      t.pools.responders = 1;  // sync -> async without pool sizes: the usual 1 response thread
    if (std::string why = e_->SetThreading(t); !why.empty())
      return {grpc::StatusCode::INVALID_ARGUMENT, why};
    FillThreading(e_, r);
    return grpc::Status::OK;
  }
  Engine* e_;
};


template <class Fn, class Req, class Resp>
void AddAdmin(Engine* e, Admin::AsyncService* svc, Fn fn, LeafHandler<Req, Resp>* h) {
  e->AddFactory(
      [svc, fn, h] {
        return std::unique_ptr<CallBase>(new UnaryCall<Admin::AsyncService, Fn, Req, Resp>(svc, fn, h));
      },
      /*admin=*/true, /*per_cq=*/2);
}

}  // namespace

struct AdminService::Parts {
  Admin::AsyncService service;
  HealthH health;
  StatsH stats;
  GetThreadingH get;
  SetThreadingH set;
  explicit Parts(Engine* e) : health(e), stats(e), get(e), set(e) {}
};

AdminService::AdminService(Engine* e) : parts_(std::make_unique<Parts>(e)) {
  Parts* p = parts_.get();
  e->RegisterService(&p->service);
  AddAdmin(e, &p->service, &Admin::AsyncService::RequestHealth, &p->health);
  AddAdmin(e, &p->service, &Admin::AsyncService::RequestStats, &p->stats);
  AddAdmin(e, &p->service, &Admin::AsyncService::RequestGetThreading, &p->get);
  AddAdmin(e, &p->service, &Admin::AsyncService::RequestSetThreading, &p->set);
}

AdminService::~AdminService() = default;

}  // namespace musku::detail
