#include "musku/sharding.h"

namespace musku {

uint64_t StableHash(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

int JumpShard(uint64_t key, int num_shards) {
  int64_t b = -1, j = 0;
  while (j < num_shards) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) *
                             (static_cast<double>(1LL << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int>(b);
}

}  // namespace musku
