// Random numbers (docs/qsim.md "Engine"): xoshiro256** streams, each seeded by splitmix64
// from the run seed and the stream's number, so the same seed gives the same run.
#pragma once

#include <cstdint>

namespace musku::qsim {

class Rng {  // xoshiro256**, seeded through splitmix64
 public:
  explicit Rng(uint64_t seed = 1);
  uint64_t Next();
  double Uniform();  // [0, 1)
  double Exp(double mean);
  double Normal();

 private:
  uint64_t s_[4];
};

uint64_t DeriveSeed(uint64_t run_seed, uint64_t stream);

}  // namespace musku::qsim
