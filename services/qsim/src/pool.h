// Pooled requests and jobs (docs/qsim.md "Engine"). // Internal to the engine (not part of engine.h's API).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace musku::qsim::internal {

// Objects allocated in chunks of 1024 (locality), recycled LIFO (hot in cache).
template <typename T>
class Pool {
 public:
  T* Get() {
    if (free_.empty()) {
      if (used_ == kChunk || chunks_.empty()) {
        chunks_.push_back(std::make_unique<T[]>(kChunk));
        used_ = 0;
      }
      ++allocated_;
      return &chunks_.back()[used_++];
    }
    T* p = free_.back();
    free_.pop_back();
    return p;
  }
  void Put(T* p) { free_.push_back(p); }
  size_t Allocated() const { return allocated_; }

 private:
  static constexpr size_t kChunk = 1024;
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::vector<T*> free_;
  size_t used_ = 0, allocated_ = 0;
};

}  // namespace musku::qsim::internal
