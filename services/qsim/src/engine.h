// μqSim-style discrete-event queueing-network simulator of microservice graphs (docs/qsim.md).
//
// The engine reads a *normalised* model (JSON written by musku/qsim/model.py, which validates
// the user's TOML); every timing rule is data in that model. One time-ordered event heap, pooled
// job objects, per-stream xoshiro256** generators derived from the run seed, log-linear
// histograms. Memory is bounded by the live state: a run whose live requests or jobs exceed the
// model's limits stops and reports saturation.
//
// The public header: the model (model.h), the random streams (rng.h), the histograms (hist.h)
// and the entry points below. The engine's own parts are internal headers (sim.h and what it
// includes); README.md lists every file and its job.
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "hist.h"
#include "model.h"
#include "rng.h"

namespace musku::qsim {

// A run-time controller (a power manager): called every control_interval_s of simulated time
// with the interval's figures {t_s, count, mean_us, p99_us, services: [{name, count, mean_us,
// p99_us, busy_core_s, cores, freq_ratio}]}; it answers {} or {"freq_ratio": [per service
// f_base / f]} (the services' DVFS from then on) or {"stop": true}.
using Controller = std::function<nlohmann::json(const nlohmann::json&)>;

// Runs the model; returns the result document (docs/qsim.md "Results").
nlohmann::json Simulate(const Model& m);
nlohmann::json Simulate(const Model& m, const Controller& control);

}  // namespace musku::qsim
