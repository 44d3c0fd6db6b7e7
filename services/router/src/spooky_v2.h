// SpookyHash V2 (Bob Jenkins, public domain design, 2012): a 128-bit non-cryptographic hash.
// Written for musku from the published description of the algorithm: messages shorter than
// 192 bytes take the "short" path (4 x 64-bit state, ShortMix/ShortEnd), longer ones the
// "long" path (12 x 64-bit state, Mix over 96-byte blocks, End = 3 x EndPartial).
// Little-endian reads, as the reference defines the hash on x86-64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace musku::router {

struct Hash128 {
  std::uint64_t h1;
  std::uint64_t h2;
};

// Hash `length` bytes at `data` with the two 64-bit seeds; returns both halves.
Hash128 SpookyV2Hash128(const void* data, std::size_t length, std::uint64_t seed1,
                        std::uint64_t seed2) noexcept;

inline std::uint64_t SpookyV2Hash64(const void* data, std::size_t length,
                                    std::uint64_t seed) noexcept {
  return SpookyV2Hash128(data, length, seed, seed).h1;
}

inline std::uint32_t SpookyV2Hash32(const void* data, std::size_t length,
                                    std::uint32_t seed) noexcept {
  return static_cast<std::uint32_t>(SpookyV2Hash128(data, length, seed, seed).h1);
}

inline Hash128 SpookyV2Hash128(std::string_view s, std::uint64_t seed1 = 0,
                               std::uint64_t seed2 = 0) noexcept {
  return SpookyV2Hash128(s.data(), s.size(), seed1, seed2);
}

}  // namespace musku::router
