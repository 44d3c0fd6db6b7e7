// Threading tables for tests: written to a temporary file, in `musku tune train`'s format.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

namespace musku_test {

inline std::string WriteFile(const std::string& text) {
  char path[] = "/tmp/musku-table-XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

inline std::string Table(const std::string& service, int cpus, const std::string& rows) {
  return R"({"format": "musku-threading-table/1", "service": ")" + service +
         R"(", "cpus": )" + std::to_string(cpus) + R"(, "rows": [)" + rows + "]}";
}

// Two rows: up to 50 QPS one poller inline, above it async-dispatch (a bound any back-to-back
// client clears by far, even on a loaded CI machine).
inline const char* kRows =
    R"({"max_qps": 50, "model": "sync-inline-block", "pollers": 1, "workers": 0, "responders": 0},
       {"max_qps": 1e9, "model": "async-dispatch-block", "pollers": 1, "workers": 2, "responders": 1})";

}  // namespace musku_test
