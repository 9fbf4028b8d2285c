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

}  // namespace moesim::app
