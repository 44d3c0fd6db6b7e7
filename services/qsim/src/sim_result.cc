// The end of a run: busy periods up to the end, the overload verdict from the backlog trend,
// and the result document (docs/qsim.md "Results", "Overload").
#include "sim.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace musku::qsim::internal {

nlohmann::json Sim::Result(double cpu_s) {
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

}  // namespace musku::qsim::internal
