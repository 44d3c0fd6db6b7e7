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

// The event queue: a one-event slot in front of a 4-ary min-heap on (time, sequence).
//
// The slot holds the earliest event whenever the latest push was earlier than everything queued
// (a thread's next completion a few microseconds ahead, a hop that lands before any other event):
// such an event is popped without touching the heap (no sift-up on push, no sift-down on pop).
// The order is exactly the heap's: (time, sequence) is a total order (sequences are unique), the
// slot's event is before every event in the heap (invariant), and pop takes the slot first, so
// the events come out in the same order as from the heap alone, ties included.
class EventHeap {
 public:
  bool empty() const { return !has_front_ && v_.empty(); }
  size_t size() const { return v_.size() + (has_front_ ? 1 : 0); }
  void push(const Event& e) {
    if (has_front_) {
      if (Before(e, front_)) {  // the new one is the earliest: the old slot event goes to the heap
        HeapPush(front_);
        front_ = e;
      } else {
        HeapPush(e);
      }
    } else if (v_.empty() || Before(e, v_[0])) {
      front_ = e;
      has_front_ = true;
    } else {
      HeapPush(e);
    }
  }
  Event pop() {
    if (has_front_) {
      has_front_ = false;
      return front_;
    }
    return HeapPop();
  }

 private:
  void HeapPush(const Event& e) {
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
  Event HeapPop() {
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

  Event front_{};
  bool has_front_ = false;
  std::vector<Event> v_;
};

}  // namespace musku::qsim::internal
