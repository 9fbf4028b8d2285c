// Turns a scenario's `engine:` section (and CLI overrides) into the simulator's EngineConfig, so
// every command that simulates reads the same knobs the same way.
#pragma once

#include <memory>
#include <string>

#include "core/scenario.hpp"
#include "sim/engine.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

/// `engine_override` is the --engine flag ("" = the scenario's engine.network), and
/// `simgrid_mode_override` the --simgrid-mode flag ("" = the scenario's engine.simgrid.mode); an
/// unknown name is an InputError listing the valid ones.
sim::EngineConfig engine_config_from(const Scenario& sc, const std::string& engine_override,
                                     const std::string& simgrid_mode_override = "");

/// InputError at model.precision.gemm (or model.dtype when it set the GEMMs' precision) when the
/// GEMMs are fp8 and `gpu` (resolved) has no fp8 tensor cores. simulation_topology calls it.
void check_precision(const Scenario& sc, const GpuSpec& gpu);

/// The SimGrid mode a run on `gpus` GPUs uses ("per_flow" or "ptask", auto resolved), or "" when
/// the engine is not simgrid. Commands print it (announce_simgrid_mode) and write it to JSON, as
/// `auto` switches to ptask above 64 GPUs.
std::string simgrid_mode_used(const sim::EngineConfig& cfg, int gpus);
void announce_simgrid_mode(const sim::EngineConfig& cfg, int gpus);

/// Applies the scenario's calibration file (cluster.calibration), if any, to `cfg`: GEMM
/// alpha/beta/efficiency table and interference into the compute model, the per-message latency
/// implied by the measured intra-node alpha and the measured per-collective lines (used by the
/// analytical engine) into the network params. engine_config_from calls it.
void apply_calibration(sim::EngineConfig& cfg, const Scenario& sc);

/// The topology every command simulates on: build_topology(sc.cluster), with its link bandwidths
/// scaled to the calibration's per-tier point-to-point betas when the scenario has a calibration
/// (topology/calibrated.hpp). simulate, compare, sweep and exec --predict use it.
std::unique_ptr<topology::Topology> simulation_topology(const Scenario& sc);

}  // namespace moesim::app
