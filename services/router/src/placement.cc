#include "placement.h"

#include "spooky_v2.h"

namespace musku::router {

std::vector<std::uint32_t> ReplicaSet(std::string_view key, std::uint32_t num_leaves,
                                      std::uint32_t replicas) {
  std::vector<std::uint32_t> out;
  if (num_leaves == 0 || replicas == 0) return out;
  const std::uint32_t r = replicas < num_leaves ? replicas : num_leaves;
  const Hash128 h = SpookyV2Hash128(key, kPlacementSeed, kPlacementSeed);
  // Mix both halves so placement uses all 128 bits, then reduce.
  const std::uint32_t primary = static_cast<std::uint32_t>((h.h1 ^ h.h2) % num_leaves);
  out.reserve(r);
  for (std::uint32_t i = 0; i < r; ++i) out.push_back((primary + i) % num_leaves);
  return out;
}

std::string ValidateKey(std::string_view key) {
  if (key.empty()) return "empty key";
  if (key.size() > kMaxKeyBytes) {
    return "key of " + std::to_string(key.size()) + " bytes exceeds memcached's 250";
  }
  for (unsigned char c : key) {
    if (c <= 0x20 || c == 0x7f) return "key contains a space or control character";
  }
  return {};
}

}  // namespace musku::router
