// A controller's intervals (a power manager: docs/qsim.md "Power management") and the progress
// lines on stderr (docs/qsim.md "Progress").
#include "sim.h"

#include <chrono>
#include <cstdio>

namespace musku::qsim::internal {

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

}  // namespace musku::qsim::internal
