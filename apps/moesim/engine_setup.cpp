#include "apps/moesim/engine_setup.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <optional>

#include "core/error.hpp"
#include "strategies/cost_model.hpp"
#include "topology/calibrated.hpp"

namespace moesim::app {

// The one place where a calibration file's values enter the simulator (docs/calibration.md,
// "Which engine uses what"). strategies/cost_model.cpp reads the same file for the strategies'
// predictions through the same helpers (scenario_calibration, calibrated_message_latency).
void apply_calibration(sim::EngineConfig& cfg, const Scenario& sc) {
  const auto cal = strategies::scenario_calibration(sc);
  if (!cal) return;
  // Compute model (every engine): alpha_gemm, beta_gemm and the efficiency table; interference
  // comes with strategies::scenario_interference, as the strategies' predictions read it.
  cfg.compute.calibration = cal->gemm;
  // Network (every engine): strategies::scenario_network_params applies the calibration to
  // cfg.net (message latency, per-collective lines), as exec's algorithm selection does. Per-tier
  // betas reach every engine through the link capacities (simulation_topology).
}

void check_precision(const Scenario& sc, const GpuSpec& gpu) {
  const PrecisionSpec& p = sc.model.precision;
  if (p.gemm != Dtype::kFp8 || gpu.peak.count(Dtype::kFp8) > 0) return;
  const bool from_dtype = !sc.written("model.precision.gemm");
  const std::string key = from_dtype ? "model.dtype" : "model.precision.gemm";
  throw InputError(sc.location_of(key), key,
                   fmt::format("found fp8, but GPU '{}' has no fp8 tensor cores; expected bf16 or "
                               "fp16{} (fp8 GEMMs run on h100-sxm, h200-sxm, h800-sxm, b200, "
                               "gb200, rtx-4090)",
                               gpu.name, from_dtype ? " (or model.precision.gemm: bf16)" : ""));
}

std::unique_ptr<topology::Topology> simulation_topology(const Scenario& sc) {
  auto topo = topology::build_topology(sc.cluster);
  check_precision(sc, topo->gpu());
  const auto cal = strategies::scenario_calibration(sc);
  if (!cal) return topo;
  return topology::calibrated_topology(std::move(topo), *cal);
}

sim::EngineConfig engine_config_from(const Scenario& sc, const std::string& engine_override,
                                     const std::string& simgrid_mode_override) {
  sim::EngineConfig cfg;
  SimgridModeKind sc_simgrid_mode = sc.engine.simgrid_mode;
  switch (sc.engine.network) {
    case NetworkModelKind::kAnalytical:
      cfg.network = sim::NetworkKind::kAnalytical;
      break;
    case NetworkModelKind::kFlow:
      cfg.network = sim::NetworkKind::kFlow;
      break;
    case NetworkModelKind::kSimgrid:
      cfg.network = sim::NetworkKind::kSimgrid;
      break;
  }
  if (!engine_override.empty()) {
    auto k = sim::parse_network_kind(engine_override);
    if (!k)
      throw InputError(fmt::format(
          "--engine: found '{}', expected one of analytical, flow, simgrid", engine_override));
    cfg.network = *k;
  }
  cfg.net = strategies::scenario_network_params(sc);
  if (!simgrid_mode_override.empty()) {
    std::optional<SimgridModeKind> m;
    for (const auto& row : simgrid_mode_names()) {
      if (row.name == simgrid_mode_override) m = row.value;
    }
    if (!m)
      throw InputError(
          fmt::format("--simgrid-mode: found '{}', expected one of auto, per_flow, ptask",
                      simgrid_mode_override));
    sc_simgrid_mode = *m;
  }
  cfg.flow_event_tolerance = sc.engine.flow_event_tolerance;
  cfg.flow_sharing = sc.engine.flow_sharing == FlowSharingKind::kPerFlow
                         ? sim::FlowSharing::kPerFlow
                         : sim::FlowSharing::kPerCollective;
  cfg.simgrid_mode = sc_simgrid_mode == SimgridModeKind::kPerFlow ? sim::SimgridMode::kPerFlow
                     : sc_simgrid_mode == SimgridModeKind::kPtask ? sim::SimgridMode::kPtask
                                                                  : sim::SimgridMode::kAuto;
  cfg.compute.launch_overhead = sc.engine.launch_overhead;
  cfg.compute.interference = strategies::scenario_interference(sc);
  cfg.compute.max_gemm_efficiency = strategies::scenario_gemm_ceiling(sc);
  cfg.precision = sc.model.dtype;
  apply_calibration(cfg, sc);
  return cfg;
}

std::string simgrid_mode_used(const sim::EngineConfig& cfg, int gpus) {
  if (cfg.network != sim::NetworkKind::kSimgrid) return "";
  return std::string(
      sim::resolved_simgrid_mode_name(sim::resolve_simgrid_mode(cfg.simgrid_mode, gpus)));
}

void announce_simgrid_mode(const sim::EngineConfig& cfg, int gpus) {
  const std::string used = simgrid_mode_used(cfg, gpus);
  if (used.empty()) return;
  std::fprintf(stderr, "moesim: simgrid mode %s%s (engine.simgrid.mode, --simgrid-mode)\n",
               used.c_str(),
               cfg.simgrid_mode == sim::SimgridMode::kAuto
                   ? (gpus <= 64 ? ", auto: <= 64 GPUs"
                                 : ", auto: > 64 GPUs; per_flow is the "
                                   "faithful reference")
                   : "");
}

}  // namespace moesim::app
