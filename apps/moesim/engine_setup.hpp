// Turns a scenario's `engine:` section (and CLI overrides) into the simulator's EngineConfig, so
// every command that simulates reads the same knobs the same way.
#pragma once

#include <string>

#include "core/scenario.hpp"
#include "sim/engine.hpp"

namespace moesim::app {

/// `engine_override` is the --engine flag ("" = the scenario's engine.network); an unknown name
/// is an InputError listing the valid ones.
sim::EngineConfig engine_config_from(const Scenario& sc, const std::string& engine_override);

/// Applies the scenario's calibration file (cluster.calibration), if any, to `cfg`: GEMM
/// alpha/beta/efficiency table and interference into the compute model, the per-message latency
/// implied by the measured intra-node alpha into the network params. engine_config_from calls it.
void apply_calibration(sim::EngineConfig& cfg, const Scenario& sc);

}  // namespace moesim::app
