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

// The event queue: a one-event slot in front of a queue of the rest, which is a small sorted
// array while it holds few events and a 4-ary min-heap on (time, sequence) when it grows.
//
// The slot holds the earliest event whenever the latest push was earlier than everything queued
// (a thread's next completion a few microseconds ahead, a hop that lands before any other event):
// such an event is popped without touching the rest (no sift-up on push, no sift-down on pop).
// Behind it, up to kSmallMax events are kept sorted latest first (the earliest at the back: a
// pop is a pop_back, a push moves the events earlier than it one place, usually a few); past
// that the array becomes a 4-ary heap (an array sorted earliest first is one already) until it
// shrinks to kSmallMax / 4, when it is sorted back. Every form pops the least event by (time,
// sequence), a total order (sequences are unique), and the slot's event is before every other
// (invariant), so events come out in the same order whichever form holds them, ties included.
class EventHeap {
 public:
  static constexpr size_t kSmallMax = 32;  // sorted while at most this many (besides the slot)

  bool empty() const { return !has_front_ && v_.empty(); }
  size_t size() const { return v_.size() + (has_front_ ? 1 : 0); }
  void push(const Event& e) {
    if (has_front_) {
      if (Before(e, front_)) {  // the new one is the earliest: the old slot event goes behind
        Insert(front_);
        front_ = e;
      } else {
        Insert(e);
      }
    } else if (v_.empty() || Before(e, Top())) {
      front_ = e;
      has_front_ = true;
    } else {
      Insert(e);
    }
  }
  Event pop() {
    if (has_front_) {
      has_front_ = false;
      return front_;
    }
    if (!big_) {
      const Event top = v_.back();
      v_.pop_back();
      return top;
    }
    const Event top = HeapPop();
    if (v_.size() <= kSmallMax / 4) {  // small again: back to the sorted form
      std::sort(v_.begin(), v_.end(), [](const Event& x, const Event& y) { return Before(y, x); });
      big_ = false;
    }
    return top;
  }

 private:
  const Event& Top() const { return big_ ? v_[0] : v_.back(); }
  void Insert(const Event& e) {
    if (big_) {
      HeapPush(e);
      return;
    }
    if (v_.size() >= kSmallMax) {  // too many to keep sorted: reversed, the array is a heap
      std::reverse(v_.begin(), v_.end());
      big_ = true;
      HeapPush(e);
      return;
    }
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0 && Before(v_[i - 1], e)) {  // the events earlier than e move one place back
      v_[i] = v_[i - 1];
      --i;
    }
    v_[i] = e;
  }
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
  bool big_ = false;  // v_ is a 4-ary heap (else sorted, latest first)
  std::vector<Event> v_;
};

}  // namespace musku::qsim::internal
