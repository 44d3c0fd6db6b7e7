// Random numbers: xoshiro256** streams seeded through splitmix64, exponential variates by a
// ziggurat (docs/qsim.md "Engine").
#include "rng.h"

#include <cmath>

namespace musku::qsim {

namespace {
uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t DeriveSeed(uint64_t run_seed, uint64_t stream) {
  uint64_t x = run_seed * 0x100000001b3ULL ^ (stream + 0x51afd7ed558ccd1dULL);
  SplitMix(x);
  return SplitMix(x);
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = SplitMix(x);
}

// Exponential variates by Marsaglia and Tsang's ziggurat ("The Ziggurat Method for Generating
// Random Variables", J. Stat. Softw. 5(8), 2000): 256 layers of equal area under e^-x, built
// once below for 53-bit magnitudes. One 64-bit draw gives the layer (low 8 bits) and, apart,
// the magnitude (high 53 bits); 98.9 % of draws return x = magnitude * w[layer] after one
// compare, the rest take the wedge test or the tail (r + Exp(1), memoryless). The same
// distribution as -log(1 - U), about 4x cheaper than log1p; the same seed gives the same values.
namespace {
constexpr double kR = 7.697117470131487;     // the base layer's right edge
constexpr double kV = 3.949659822581572e-3;  // each layer's area
rng_detail::ExpZigTables BuildExpZig() {
  rng_detail::ExpZigTables z{};
  uint64_t* k = z.k;
  double* w = z.w;
  double* f = z.f;
  const double m = 9007199254740992.0;  // 2^53
  double de = kR, te = kR;
  const double q = kV / std::exp(-de);
  k[0] = static_cast<uint64_t>((de / q) * m);
  k[1] = 0;
  w[0] = q / m;
  w[255] = de / m;
  f[0] = 1.0;
  f[255] = std::exp(-de);
  for (int i = 254; i >= 1; --i) {
    de = -std::log(kV / de + std::exp(-de));
    k[i + 1] = static_cast<uint64_t>((de / te) * m);
    te = de;
    f[i] = std::exp(-de);
    w[i] = de / m;
  }
  return z;
}
}  // namespace

namespace rng_detail {
const ExpZigTables kExpZig = BuildExpZig();
}  // namespace rng_detail

// Rng::Exp (rng.h) rejected its first draw's rectangle: layer i, x its value.
double Rng::ExpRest(double mean, unsigned i, double x) {
  using rng_detail::kExpZig;
  for (;;) {
    if (i == 0) return mean * (kR - std::log1p(-Uniform()));  // the tail
    if (kExpZig.f[i] + Uniform() * (kExpZig.f[i - 1] - kExpZig.f[i]) < std::exp(-x)) return mean * x;
    const uint64_t r = Next();
    i = static_cast<unsigned>(r & 0xff);
    const uint64_t mag = r >> 11;
    x = static_cast<double>(mag) * kExpZig.w[i];
    if (mag < kExpZig.k[i]) return mean * x;
  }
}

double Rng::Normal() {  // Box-Muller, one value per call (simple; reproducible)
  const double u1 = 1.0 - Uniform(), u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace musku::qsim
