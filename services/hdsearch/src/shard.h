// An HDSearch leaf's shard: contiguous rows [begin, end) and exact top-k over candidate ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace musku::hdsearch {

class Shard {
 public:
  Shard(std::vector<float> rows, std::uint32_t dim, std::uint64_t begin);

  // Squared distances from q to each candidate; the k smallest, nearest first.
  // Returns an empty string on success, else why the request is invalid.
  std::string TopK(const float* q, std::size_t qdim, const std::uint32_t* ids, std::size_t n,
                   std::size_t k, std::vector<std::uint32_t>* out_ids,
                   std::vector<float>* out_dist) const;

  std::uint64_t begin() const { return begin_; }
  std::uint64_t end() const { return begin_ + rows_.size() / dim_; }
  std::uint32_t dim() const { return dim_; }

 private:
  std::vector<float> rows_;
  std::uint32_t dim_;
  std::uint64_t begin_;
};

}  // namespace musku::hdsearch
