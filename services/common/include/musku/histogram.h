// HDR-style log-linear latency histogram: at most 1.6 % relative bucket width from 1 ns to ~18 minutes,
// lock-free Record() from any number of threads, mergeable, percentile queries.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace musku {

class Histogram {
 public:
  static constexpr int kSubBits = 7;  // 128 linear sub-buckets per power of two
  static constexpr int64_t kMaxValue = (int64_t{1} << 40) - 1;

  Histogram();
  Histogram(const Histogram& other);
  Histogram& operator=(const Histogram& other);

  void Record(int64_t value_ns);         // values < 0 count as 0, > kMaxValue as kMaxValue
  void RecordN(int64_t value_ns, uint64_t n);
  void Merge(const Histogram& other);
  void Reset();

  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  int64_t Max() const { return max_.load(std::memory_order_relaxed); }
  int64_t Min() const;
  double Mean() const;
  // Smallest recorded-bucket upper bound v such that at least q of the values are <= v
  // (0 <= q <= 1), capped at Max(). 0 for an empty histogram.
  int64_t Percentile(double q) const;

  // Non-empty buckets as (inclusive upper bound in ns, count), ascending.
  std::vector<std::pair<int64_t, uint64_t>> Buckets() const;

  static int IndexOf(int64_t v);
  static int64_t UpperBound(int index);
  static int64_t LowerBound(int index);
  static int NumBuckets();

 private:
  std::vector<std::atomic<uint64_t>> counts_;
  std::atomic<uint64_t> count_{0};
  std::atomic<int64_t> max_{0};
  std::atomic<int64_t> sum_{0};
};

}  // namespace musku
