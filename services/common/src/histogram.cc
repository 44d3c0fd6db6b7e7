#include "musku/histogram.h"

#include <algorithm>
#include <cmath>

namespace musku {
namespace {
constexpr int kSub = 1 << Histogram::kSubBits;
constexpr int kHalf = kSub / 2;
int Msb(uint64_t v) { return 63 - __builtin_clzll(v); }
}  // namespace

int Histogram::IndexOf(int64_t v) {
  if (v < 0) v = 0;
  if (v > kMaxValue) v = kMaxValue;
  if (v < kSub) return static_cast<int>(v);
  const int shift = Msb(static_cast<uint64_t>(v)) - (kSubBits - 1);
  return shift * kHalf + static_cast<int>(v >> shift);
}

int64_t Histogram::LowerBound(int index) {
  if (index < kSub) return index;
  const int shift = index / kHalf - 1;
  const int64_t mant = index % kHalf + kHalf;
  return mant << shift;
}

int64_t Histogram::UpperBound(int index) {
  if (index < kSub) return index;
  const int shift = index / kHalf - 1;
  const int64_t mant = index % kHalf + kHalf;
  return ((mant + 1) << shift) - 1;
}

int Histogram::NumBuckets() { return IndexOf(kMaxValue) + 1; }

Histogram::Histogram() : counts_(static_cast<size_t>(NumBuckets())) {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
}

Histogram::Histogram(const Histogram& other) : Histogram() { Merge(other); }

Histogram& Histogram::operator=(const Histogram& other) {
  if (this != &other) {
    Reset();
    Merge(other);
  }
  return *this;
}

void Histogram::Record(int64_t v) { RecordN(v, 1); }

void Histogram::RecordN(int64_t v, uint64_t n) {
  if (n == 0) return;
  if (v < 0) v = 0;
  if (v > kMaxValue) v = kMaxValue;
  counts_[static_cast<size_t>(IndexOf(v))].fetch_add(n, std::memory_order_relaxed);
  count_.fetch_add(n, std::memory_order_relaxed);
  sum_.fetch_add(v * static_cast<int64_t>(n), std::memory_order_relaxed);
  int64_t m = max_.load(std::memory_order_relaxed);
  while (v > m && !max_.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
  }
}

void Histogram::Merge(const Histogram& other) {
  for (size_t i = 0; i < counts_.size(); ++i) {
    const uint64_t c = other.counts_[i].load(std::memory_order_relaxed);
    if (c) counts_[i].fetch_add(c, std::memory_order_relaxed);
  }
  count_.fetch_add(other.count_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  sum_.fetch_add(other.sum_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  const int64_t om = other.max_.load(std::memory_order_relaxed);
  int64_t m = max_.load(std::memory_order_relaxed);
  while (om > m && !max_.compare_exchange_weak(m, om, std::memory_order_relaxed)) {
  }
}

void Histogram::Reset() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  max_.store(0, std::memory_order_relaxed);
}

int64_t Histogram::Min() const {
  for (size_t i = 0; i < counts_.size(); ++i)
    if (counts_[i].load(std::memory_order_relaxed)) return LowerBound(static_cast<int>(i));
  return 0;
}

double Histogram::Mean() const {
  const uint64_t c = Count();
  return c ? static_cast<double>(sum_.load(std::memory_order_relaxed)) / static_cast<double>(c) : 0.0;
}

int64_t Histogram::Percentile(double q) const {
  const uint64_t total = Count();
  if (total == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  uint64_t target = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  if (target == 0) target = 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i].load(std::memory_order_relaxed);
    if (seen >= target) return std::min(UpperBound(static_cast<int>(i)), Max());
  }
  return Max();
}

std::vector<std::pair<int64_t, uint64_t>> Histogram::Buckets() const {
  std::vector<std::pair<int64_t, uint64_t>> out;
  for (size_t i = 0; i < counts_.size(); ++i) {
    const uint64_t c = counts_[i].load(std::memory_order_relaxed);
    if (c) out.emplace_back(UpperBound(static_cast<int>(i)), c);
  }
  return out;
}

}  // namespace musku
