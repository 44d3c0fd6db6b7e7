// Key -> replica set placement for the Router (SpookyHash V2 of the key, then consecutive leaves).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace musku::router {

// The hash seed is fixed so every mid-tier instance places a key identically.
inline constexpr std::uint64_t kPlacementSeed = 0x6d75736b75ULL;  // "musku"

// Leaves (indices into the leaf list) holding `key`: primary = hash % num_leaves, then the
// next (replicas - 1) leaves around the ring. Returns min(replicas, num_leaves) distinct indices.
std::vector<std::uint32_t> ReplicaSet(std::string_view key, std::uint32_t num_leaves,
                                      std::uint32_t replicas);

// memcached's text-protocol key rules: 1..250 bytes, no control characters or spaces.
// Returns an empty string when valid, else why not.
std::string ValidateKey(std::string_view key);

inline constexpr std::size_t kMaxKeyBytes = 250;
inline constexpr std::size_t kMaxValueBytes = 1024 * 1024 - 512;  // memcached's default item max

}  // namespace musku::router
