// Minimal timestamped logging to stderr (thread-safe: one write(2) per line).
#pragma once

namespace musku {
void LogInfo(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
}  // namespace musku
