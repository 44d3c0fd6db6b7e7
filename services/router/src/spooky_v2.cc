#include "spooky_v2.h"

#include <cstring>

namespace musku::router {
namespace {

constexpr std::size_t kNumVars = 12;              // 64-bit words of long-path state
constexpr std::size_t kBlockSize = kNumVars * 8;  // 96 bytes consumed per Mix
constexpr std::size_t kBufSize = 2 * kBlockSize;  // messages below this take the short path
constexpr std::uint64_t kConst = 0xdeadbeefdeadbeefULL;

inline std::uint64_t Rot(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

inline std::uint64_t Load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);  // unaligned-safe; little-endian host assumed (x86-64, aarch64)
  return v;
}
inline std::uint32_t Load32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- short path -------------------------------------------------------------------------
inline void ShortMix(std::uint64_t& h0, std::uint64_t& h1, std::uint64_t& h2, std::uint64_t& h3) {
  h2 = Rot(h2, 50); h2 += h3; h0 ^= h2;
  h3 = Rot(h3, 52); h3 += h0; h1 ^= h3;
  h0 = Rot(h0, 30); h0 += h1; h2 ^= h0;
  h1 = Rot(h1, 41); h1 += h2; h3 ^= h1;
  h2 = Rot(h2, 54); h2 += h3; h0 ^= h2;
  h3 = Rot(h3, 48); h3 += h0; h1 ^= h3;
  h0 = Rot(h0, 38); h0 += h1; h2 ^= h0;
  h1 = Rot(h1, 37); h1 += h2; h3 ^= h1;
  h2 = Rot(h2, 62); h2 += h3; h0 ^= h2;
  h3 = Rot(h3, 34); h3 += h0; h1 ^= h3;
  h0 = Rot(h0, 5);  h0 += h1; h2 ^= h0;
  h1 = Rot(h1, 36); h1 += h2; h3 ^= h1;
}

inline void ShortEnd(std::uint64_t& h0, std::uint64_t& h1, std::uint64_t& h2, std::uint64_t& h3) {
  h3 ^= h2; h2 = Rot(h2, 15); h3 += h2;
  h0 ^= h3; h3 = Rot(h3, 52); h0 += h3;
  h1 ^= h0; h0 = Rot(h0, 26); h1 += h0;
  h2 ^= h1; h1 = Rot(h1, 51); h2 += h1;
  h3 ^= h2; h2 = Rot(h2, 28); h3 += h2;
  h0 ^= h3; h3 = Rot(h3, 9);  h0 += h3;
  h1 ^= h0; h0 = Rot(h0, 47); h1 += h0;
  h2 ^= h1; h1 = Rot(h1, 54); h2 += h1;
  h3 ^= h2; h2 = Rot(h2, 32); h3 += h2;
  h0 ^= h3; h3 = Rot(h3, 25); h0 += h3;
  h1 ^= h0; h0 = Rot(h0, 63); h1 += h0;
}

Hash128 Short(const unsigned char* p, std::size_t length, std::uint64_t seed1,
              std::uint64_t seed2) {
  std::uint64_t a = seed1, b = seed2, c = kConst, d = kConst;
  std::size_t remainder = length % 32;
  if (length > 15) {
    const unsigned char* end = p + (length / 32) * 32;
    for (; p < end; p += 32) {  // whole 32-byte chunks
      c += Load64(p);
      d += Load64(p + 8);
      ShortMix(a, b, c, d);
      a += Load64(p + 16);
      b += Load64(p + 24);
    }
    if (remainder >= 16) {  // one more 16-byte chunk
      c += Load64(p);
      d += Load64(p + 8);
      ShortMix(a, b, c, d);
      p += 16;
      remainder -= 16;
    }
  }
  // the last 0..15 bytes, and the length in the top byte of d
  d += static_cast<std::uint64_t>(length) << 56;
  switch (remainder) {
    case 15: d += static_cast<std::uint64_t>(p[14]) << 48; [[fallthrough]];
    case 14: d += static_cast<std::uint64_t>(p[13]) << 40; [[fallthrough]];
    case 13: d += static_cast<std::uint64_t>(p[12]) << 32; [[fallthrough]];
    case 12: d += Load32(p + 8); c += Load64(p); break;
    case 11: d += static_cast<std::uint64_t>(p[10]) << 16; [[fallthrough]];
    case 10: d += static_cast<std::uint64_t>(p[9]) << 8; [[fallthrough]];
    case 9: d += static_cast<std::uint64_t>(p[8]); [[fallthrough]];
    case 8: c += Load64(p); break;
    case 7: c += static_cast<std::uint64_t>(p[6]) << 48; [[fallthrough]];
    case 6: c += static_cast<std::uint64_t>(p[5]) << 40; [[fallthrough]];
    case 5: c += static_cast<std::uint64_t>(p[4]) << 32; [[fallthrough]];
    case 4: c += Load32(p); break;
    case 3: c += static_cast<std::uint64_t>(p[2]) << 16; [[fallthrough]];
    case 2: c += static_cast<std::uint64_t>(p[1]) << 8; [[fallthrough]];
    case 1: c += static_cast<std::uint64_t>(p[0]); break;
    case 0: c += kConst; d += kConst; break;
    default: break;
  }
  ShortEnd(a, b, c, d);
  return {a, b};
}

// ---- long path --------------------------------------------------------------------------
struct State {
  std::uint64_t s[kNumVars];
};

inline void Mix(const unsigned char* data, State& st) {
  std::uint64_t* s = st.s;
  // Each step: absorb one word, xor a neighbour, rotate, add: repeated round-robin over 12.
  static constexpr int kRot[kNumVars] = {11, 32, 43, 31, 17, 28, 39, 57, 55, 54, 22, 46};
  for (std::size_t i = 0; i < kNumVars; ++i) {
    s[i] += Load64(data + 8 * i);
    s[(i + 2) % kNumVars] ^= s[(i + 10) % kNumVars];
    s[(i + 11) % kNumVars] ^= s[i];
    s[i] = Rot(s[i], kRot[i]);
    s[(i + 11) % kNumVars] += s[(i + 1) % kNumVars];
  }
}

inline void EndPartial(State& st) {
  std::uint64_t* h = st.s;
  static constexpr int kRot[kNumVars] = {44, 15, 34, 21, 38, 33, 10, 13, 38, 53, 42, 54};
  // step i: h[i+11] += h[i+1]; h[i+2] ^= h[i+11]; h[i+1] = rot(h[i+1], r_i)   (indices mod 12)
  for (std::size_t i = 0; i < kNumVars; ++i) {
    h[(i + 11) % kNumVars] += h[(i + 1) % kNumVars];
    h[(i + 2) % kNumVars] ^= h[(i + 11) % kNumVars];
    h[(i + 1) % kNumVars] = Rot(h[(i + 1) % kNumVars], kRot[i]);
  }
}

Hash128 Long(const unsigned char* p, std::size_t length, std::uint64_t seed1,
             std::uint64_t seed2) {
  State st;
  for (std::size_t i = 0; i < kNumVars; i += 3) {
    st.s[i] = seed1;
    st.s[i + 1] = seed2;
    st.s[i + 2] = kConst;
  }
  const std::size_t whole = (length / kBlockSize) * kBlockSize;
  for (std::size_t off = 0; off < whole; off += kBlockSize) Mix(p + off, st);
  // last partial block: zero padded, its length in the final byte
  unsigned char buf[kBlockSize];
  const std::size_t remainder = length - whole;
  std::memcpy(buf, p + whole, remainder);
  std::memset(buf + remainder, 0, kBlockSize - remainder);
  buf[kBlockSize - 1] = static_cast<unsigned char>(remainder);
  for (std::size_t i = 0; i < kNumVars; ++i) st.s[i] += Load64(buf + 8 * i);
  EndPartial(st);
  EndPartial(st);
  EndPartial(st);
  return {st.s[0], st.s[1]};
}

}  // namespace

Hash128 SpookyV2Hash128(const void* data, std::size_t length, std::uint64_t seed1,
                        std::uint64_t seed2) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  if (length < kBufSize) return Short(p, length, seed1, seed2);
  return Long(p, length, seed1, seed2);
}

}  // namespace musku::router
