// The engine's entry points: Simulate runs a model (Setup, the event loop, the result) and
// reports the process's own CPU time and peak RSS.
#include "sim.h"

#include <cstdio>
#include <ctime>

namespace musku::qsim {
namespace internal {

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

nlohmann::json Sim::Run() {
  Setup();
  const std::clock_t cpu0 = std::clock();
  Loop();
  const double cpu_s = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  return Result(cpu_s);
}

}  // namespace internal

nlohmann::json Simulate(const Model& m) {
  internal::Sim s(m);
  return s.Run();
}

nlohmann::json Simulate(const Model& m, const Controller& control) {
  internal::Sim s(m, &control);
  return s.Run();
}

}  // namespace musku::qsim
