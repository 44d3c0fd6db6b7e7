#include "shard.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "vectors.h"

namespace musku::hdsearch {

Shard::Shard(std::vector<float> rows, std::uint32_t dim, std::uint64_t begin)
    : rows_(std::move(rows)), dim_(dim), begin_(begin) {
  if (dim_ == 0 || rows_.size() % dim_ != 0) throw std::invalid_argument("shard: bad dimension");
}

std::string Shard::TopK(const float* q, std::size_t qdim, const std::uint32_t* ids, std::size_t n,
                        std::size_t k, std::vector<std::uint32_t>* out_ids,
                        std::vector<float>* out_dist) const {
  if (qdim != dim_) {
    return "query has " + std::to_string(qdim) + " dimensions, the data " + std::to_string(dim_);
  }
  if (k == 0) return "k must be > 0";
  const std::uint64_t lo = begin(), hi = end();
  std::vector<std::pair<float, std::uint32_t>> d;
  d.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (ids[i] < lo || ids[i] >= hi) {
      return "id " + std::to_string(ids[i]) + " is not in this shard [" + std::to_string(lo) + ", " +
             std::to_string(hi) + ")";
    }
    d.emplace_back(SquaredL2(rows_.data() + (ids[i] - lo) * dim_, q, dim_), ids[i]);
  }
  const std::size_t kk = std::min(k, d.size());
  std::partial_sort(d.begin(), d.begin() + static_cast<long>(kk), d.end());
  out_ids->clear();
  out_dist->clear();
  for (std::size_t i = 0; i < kk; ++i) {
    out_ids->push_back(d[i].second);
    out_dist->push_back(d[i].first);
  }
  return {};
}

}  // namespace musku::hdsearch
