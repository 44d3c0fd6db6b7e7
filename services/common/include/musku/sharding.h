// Sharding helpers shared by services: which shard owns a key / document.
#pragma once

#include <cstdint>
#include <string_view>

namespace musku {

// 64-bit FNV-1a; stable across builds and hosts (used to place string keys).
uint64_t StableHash(std::string_view s);

// Jump consistent hash (Lamping & Veach): bucket in [0, num_shards) for a 64-bit key; moving
// from n to n+1 shards relocates only ~1/(n+1) of the keys. num_shards must be >= 1.
int JumpShard(uint64_t key, int num_shards);

// Document sharding by range-stable modulo: doc_id -> shard in [0, num_shards).
inline int DocShard(uint64_t doc_id, int num_shards) {
  return static_cast<int>(doc_id % static_cast<uint64_t>(num_shards));
}

}  // namespace musku
