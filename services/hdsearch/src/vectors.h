// HDSearch vector files and the distance kernel.
//
// File format (written by musku/services/datasets.py, little-endian):
//   bytes 0..7   magic "MKUVEC01"
//   bytes 8..15  uint64 rows
//   bytes 16..19 uint32 dim
//   bytes 20..23 uint32 dtype (0 = float32)
//   bytes 24..31 reserved (0)
//   then rows * dim float32, row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace musku::hdsearch {

inline constexpr char kVecMagic[8] = {'M', 'K', 'U', 'V', 'E', 'C', '0', '1'};
inline constexpr std::size_t kVecHeaderBytes = 32;

struct VecHeader {
  std::uint64_t rows = 0;
  std::uint32_t dim = 0;
};

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads and validates the header (magic, dtype, exact file size). Throws DataError.
VecHeader ReadVecHeader(const std::string& path);

// Rows [begin, end) as one contiguous row-major array; rejects NaN/Inf. Throws DataError.
std::vector<float> ReadVecRows(const std::string& path, const VecHeader& h, std::uint64_t begin,
                               std::uint64_t end);

void WriteVecFile(const std::string& path, const std::vector<float>& data, std::uint32_t dim);

// Squared Euclidean distance (explicit SIMD via GCC vector extensions; AVX2 clone dispatched at
// load time where the CPU has it).
float SquaredL2(const float* a, const float* b, std::size_t dim) noexcept;
float Dot(const float* a, const float* b, std::size_t dim) noexcept;

// Contiguous rows [begin, end) of a shard split of `rows` into `shards` parts.
inline std::uint64_t ShardBegin(std::uint64_t rows, std::uint32_t shard, std::uint32_t shards) {
  return rows * shard / shards;
}

}  // namespace musku::hdsearch
