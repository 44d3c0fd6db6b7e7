// Latency histograms (docs/qsim.md "Engine"): log-linear, within 0.05 % of the recorded value,
// and the batch-means intervals of the mean and percentiles.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

namespace musku::qsim {

// Log-linear histogram of non-negative integer values (ns): exact below 2,048 ns, then 1,024
// sub-buckets per power of two (<= 0.098 % relative bucket width; a percentile is its bucket's
// midpoint, so within 0.05 % of the recorded value). Octaves are allocated on first use, so an
// idle histogram costs a few dozen bytes and a busy one the few octaves its values span. No
// atomics: the simulator is single-threaded and records 10^8 values per run.
class Hist {
 public:
  static constexpr int kSubBits = 11;  // 2^11 exact values, then 2^10 buckets per octave
  static constexpr int kSegments = 35;  // segments of 2^10 buckets: 2 exact, then octaves to 2^44 ns
  Hist() = default;
  Hist(const Hist& o) { *this = o; }
  Hist& operator=(const Hist& o);
  Hist(Hist&&) = default;
  Hist& operator=(Hist&&) = default;
  void Record(int64_t v) {  // inline: it runs for every job and request
    if (v < 0) v = 0;
    const int i = Index(v);
    const size_t s = static_cast<size_t>(i >> (kSubBits - 1));
    uint64_t* seg = seg_[s] ? seg_[s].get() : Segment(s);
    ++seg[i & ((1 << (kSubBits - 1)) - 1)];
    ++count_;
    sum_ += static_cast<double>(v);
    if (v > max_) max_ = v;
  }
  static constexpr int64_t kMaxValue = (int64_t{1} << 44) - 1;
  static constexpr int Index(int64_t v) {  // the bucket of a value (clamped to [0, kMaxValue])
    if (v < 0) v = 0;
    if (v > kMaxValue) v = kMaxValue;
    if (v < (1 << kSubBits)) return static_cast<int>(v);
    const int shift = (63 - __builtin_clzll(static_cast<uint64_t>(v))) - (kSubBits - 1);
    return shift * (1 << (kSubBits - 1)) + static_cast<int>(v >> shift);
  }
  void Merge(const Hist& o);
  uint64_t Count() const { return count_; }
  double Mean() const { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
  int64_t Max() const { return max_; }
  int64_t Percentile(double q) const;
  nlohmann::json Summary() const;  // {count, mean_us, p50_us, p90_us, p99_us, p999_us, max_us}
  nlohmann::json Buckets() const;  // non-empty buckets as [upper bound in us, count]

 private:
  uint64_t* Segment(size_t s);  // allocated on first use
  std::unique_ptr<uint64_t[]> seg_[kSegments];  // [segment][sub-bucket], null until used
  uint64_t count_ = 0;
  double sum_ = 0;
  int64_t max_ = 0;
};

// Batch-means confidence intervals of the mean and of percentiles: the measured requests split
// by arrival time into `n` consecutive batches, each its own histogram; the interval is the full
// data's mean or percentile +- t(0.975, n-1) x the batches' standard deviation / sqrt(n). The
// mean's is given where every batch holds at least 20 values, a percentile's where every batch
// holds at least 20 values above it (p99: 2,000 a batch).
class BatchHists {
 public:
  explicit BatchHists(int n = 20) : h_(static_cast<size_t>(n)) {}
  void Record(double frac, int64_t v);  // frac in [0, 1): where in the window it arrived
  // {"mean_us": [lo, hi], "p50_us": [lo, hi], "p90_us": .., "p99_us": .., "batches": n} for
  // the figures it can give
  nlohmann::json Intervals(const Hist& all) const;

 private:
  std::vector<Hist> h_;
};

}  // namespace musku::qsim
