// Log-linear latency histograms and their batch-means intervals (docs/qsim.md "Engine").
#include "hist.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace musku::qsim {

namespace {
constexpr int kSubBits = Hist::kSubBits;
constexpr int kSub = 1 << kSubBits;
constexpr int kHalf = kSub / 2;
constexpr int64_t kMaxValue = Hist::kMaxValue;
constexpr int IndexOf(int64_t v) { return Hist::Index(v); }
inline int64_t UpperBound(int index) {
  if (index < kSub) return index;
  const int shift = index / kHalf - 1;
  const int64_t mant = index % kHalf + kHalf;
  return ((mant + 1) << shift) - 1;
}
inline int64_t Midpoint(int index) {
  if (index < kSub) return index;
  const int shift = index / kHalf - 1;
  const int64_t mant = index % kHalf + kHalf;
  return (mant << shift) + ((int64_t{1} << shift) >> 1);
}
static_assert(((IndexOf(kMaxValue) >> (kSubBits - 1)) + 1) == Hist::kSegments, "Hist::kSegments");
}  // namespace

Hist& Hist::operator=(const Hist& o) {
  if (this == &o) return *this;
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    if (o.seg_[s]) {
      seg_[s].reset(new uint64_t[kHalf]);
      std::copy(o.seg_[s].get(), o.seg_[s].get() + kHalf, seg_[s].get());
    } else {
      seg_[s].reset();
    }
  }
  count_ = o.count_;
  sum_ = o.sum_;
  max_ = o.max_;
  return *this;
}

uint64_t* Hist::Segment(size_t s) {
  if (!seg_[s]) seg_[s].reset(new uint64_t[kHalf]());
  return seg_[s].get();
}

void Hist::Merge(const Hist& o) {
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    if (!o.seg_[s]) continue;
    uint64_t* seg = Segment(s);
    for (int k = 0; k < kHalf; ++k) seg[k] += o.seg_[s][k];
  }
  count_ += o.count_;
  sum_ += o.sum_;
  max_ = std::max(max_, o.max_);
}

int64_t Hist::Percentile(double q) const {
  if (count_ == 0) return 0;
  const double target = std::max(1.0, std::ceil(q * static_cast<double>(count_)));
  uint64_t seen = 0;
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    const uint64_t* seg = seg_[s].get();
    if (!seg) continue;
    for (int k = 0; k < kHalf; ++k) {
      seen += seg[k];
      if (seg[k] > 0 && static_cast<double>(seen) >= target)
        return std::min(Midpoint(static_cast<int>((s << (kSubBits - 1)) + static_cast<size_t>(k))), max_);
    }
  }
  return max_;
}

nlohmann::json Hist::Buckets() const {
  nlohmann::json out = nlohmann::json::array();
  for (size_t s = 0; s < static_cast<size_t>(kSegments); ++s) {
    if (!seg_[s]) continue;
    for (int k = 0; k < kHalf; ++k)
      if (seg_[s][k] > 0)
        out.push_back({static_cast<double>(UpperBound(static_cast<int>((s << (kSubBits - 1)) + static_cast<size_t>(k)))) / 1000.0,
                       seg_[s][k]});
  }
  return out;
}

nlohmann::json Hist::Summary() const {
  auto us = [](int64_t ns) { return static_cast<double>(ns) / 1000.0; };
  return {{"count", count_},          {"mean_us", Mean() / 1000.0},
          {"p50_us", us(Percentile(0.5))}, {"p90_us", us(Percentile(0.9))},
          {"p99_us", us(Percentile(0.99))}, {"p999_us", us(Percentile(0.999))},
          {"max_us", us(max_)}};
}

void BatchHists::Record(double frac, int64_t v) {
  const double n = static_cast<double>(h_.size());
  size_t b = static_cast<size_t>(std::max(0.0, std::min(n - 1, std::floor(frac * n))));
  h_[b].Record(v);
}

nlohmann::json BatchHists::Intervals(const Hist& all) const {
  // t(0.975, n-1) for the batch counts used here; larger n: the normal quantile
  static const double kT[] = {0, 0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262,
                              2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093};
  const size_t n = h_.size();
  nlohmann::json out = nlohmann::json::object();
  out["batches"] = n;
  if (n < 2) return out;
  const double t = n < sizeof(kT) / sizeof(kT[0]) ? kT[n] : 1.96;
  {  // the mean: the batches' means (each batch at least 20 values)
    double sum = 0, sum2 = 0;
    bool enough = true;
    for (const Hist& h : h_) {
      if (h.Count() < 20) {
        enough = false;
        break;
      }
      const double x = h.Mean() / 1000.0;
      sum += x;
      sum2 += x * x;
    }
    if (enough) {
      const double nn = static_cast<double>(n);
      const double mean = sum / nn;
      const double sd = std::sqrt(std::max(0.0, (sum2 - nn * mean * mean) / (nn - 1)));
      const double centre = all.Mean() / 1000.0;
      out["mean_us"] = {centre - t * sd / std::sqrt(nn), centre + t * sd / std::sqrt(nn)};
    }
  }
  for (const auto& [key, q] : {std::pair<const char*, double>{"p50_us", 0.5}, {"p90_us", 0.9}, {"p99_us", 0.99}}) {
    double sum = 0, sum2 = 0;
    bool enough = true;
    for (const Hist& h : h_) {
      if (static_cast<double>(h.Count()) * (1 - q) < 20) {
        enough = false;
        break;
      }
      const double x = static_cast<double>(h.Percentile(q)) / 1000.0;
      sum += x;
      sum2 += x * x;
    }
    if (!enough) continue;
    const double nn = static_cast<double>(n);
    const double mean = sum / nn;
    const double sd = std::sqrt(std::max(0.0, (sum2 - nn * mean * mean) / (nn - 1)));
    const double centre = static_cast<double>(all.Percentile(q)) / 1000.0;
    const double half = t * sd / std::sqrt(nn);
    out[key] = {centre - half, centre + half};
  }
  return out;
}

}  // namespace musku::qsim
