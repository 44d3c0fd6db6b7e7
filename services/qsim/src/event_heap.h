// The engine's one time-ordered event queue (docs/qsim.md "Engine"). // Internal to the engine (not part of engine.h's API).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace musku::qsim::internal {

enum EvType : uint8_t { kArrival, kUser, kJobArrive, kCopies, kDone, kWarmup, kWake, kControl };

struct Event {
  double t;
  uint64_t key;  // insertion sequence << 8 | type: ties at the same instant run in FIFO order
  void* p;
  int a;
  int b;
  EvType type() const { return static_cast<EvType>(key & 0xff); }
};

inline bool Before(const Event& x, const Event& y) { return x.t < y.t || (x.t == y.t && x.key < y.key); }

// A 4-ary min-heap on (time, sequence): half the depth of a binary heap, children contiguous.
class EventHeap {
 public:
  bool empty() const { return v_.empty(); }
  size_t size() const { return v_.size(); }
  void push(const Event& e) {
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!Before(e, v_[parent])) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = e;
  }
  Event pop() {
    const Event top = v_[0];
    const Event last = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n == 0) return top;
    size_t i = 0;
    for (;;) {
      const size_t c = 4 * i + 1;
      if (c >= n) break;
      size_t best = c;
      const size_t end = std::min(c + 4, n);
      for (size_t k = c + 1; k < end; ++k)
        if (Before(v_[k], v_[best])) best = k;
      if (!Before(v_[best], last)) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = last;
    return top;
  }

 private:
  std::vector<Event> v_;
};

}  // namespace musku::qsim::internal
