#include "musku/log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace musku {
namespace {
void VLog(const char* level, const char* fmt, va_list ap) {
  char buf[2048];
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  gmtime_r(&ts.tv_sec, &t);
  int n = std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03ld %s ", t.tm_hour, t.tm_min, t.tm_sec,
                        ts.tv_nsec / 1000000, level);
  if (n < 0) return;
  int m = std::vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n) - 1, fmt, ap);
  if (m < 0) return;
  size_t len = static_cast<size_t>(n) + static_cast<size_t>(m);
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  ssize_t w = ::write(STDERR_FILENO, buf, len);
  (void)w;
}
}  // namespace

void LogInfo(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog("I", fmt, ap);
  va_end(ap);
}

void LogError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog("E", fmt, ap);
  va_end(ap);
}
}  // namespace musku
