// Random numbers (docs/qsim.md "Engine"): xoshiro256** streams, each seeded by splitmix64
// from the run seed and the stream's number, so the same seed gives the same run.
#pragma once

#include <cstdint>

namespace musku::qsim {

namespace rng_detail {
// The exponential ziggurat's tables (rng.cc builds them once; see Rng::Exp there).
struct ExpZigTables {
  uint64_t k[256];  // a magnitude below k[i] is inside layer i's rectangle: accept at once
  double w[256];    // magnitude -> x
  double f[256];    // e^-x at layer i's right edge
};
extern const ExpZigTables kExpZig;
inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace rng_detail

class Rng {  // xoshiro256**, seeded through splitmix64
 public:
  explicit Rng(uint64_t seed = 1);
  // inline (called for every service time): the engine's other translation units inline it
  uint64_t Next() {
    const uint64_t result = rng_detail::Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rng_detail::Rotl(s_[3], 45);
    return result;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // The ziggurat's accept-at-once branch (98.9 % of draws) inline, the wedge and the tail out of
  // line (ExpRest, rng.cc): the same draws and the same values as one out-of-line function.
  double Exp(double mean) {
    const uint64_t r = Next();
    const unsigned i = static_cast<unsigned>(r & 0xff);
    const uint64_t mag = r >> 11;
    const double x = static_cast<double>(mag) * rng_detail::kExpZig.w[i];
    if (mag < rng_detail::kExpZig.k[i]) return mean * x;
    return ExpRest(mean, i, x);
  }
  double Normal();

 private:
  double ExpRest(double mean, unsigned i, double x);
  uint64_t s_[4];
};

uint64_t DeriveSeed(uint64_t run_seed, uint64_t stream);

}  // namespace musku::qsim
