#include "apps/moesim/engine_setup.hpp"

#include <fmt/format.h>

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
  // Compute model (every engine): alpha_gemm, beta_gemm and the efficiency table.
  cfg.compute.calibration = cal->gemm;
  if (cal->interference) cfg.compute.interference = *cal->interference;
  // Network (every engine): the per-message latency the measured intra-node point-to-point
  // alpha implies on top of the topology's own latency.
  cfg.net.message_latency_s =
      strategies::calibrated_message_latency(cal.get(), sc.cluster, cfg.net.message_latency_s);
  // Per-tier betas reach every engine through the link capacities (simulation_topology); the
  // measured per-collective lines replace the analytical engine's closed forms
  // (sim::analytical_collective_time).
  cfg.net.calibration = cal;
}

std::unique_ptr<topology::Topology> simulation_topology(const Scenario& sc) {
  auto topo = topology::build_topology(sc.cluster);
  const auto cal = strategies::scenario_calibration(sc);
  if (!cal) return topo;
  return topology::calibrated_topology(std::move(topo), *cal);
}

sim::EngineConfig engine_config_from(const Scenario& sc, const std::string& engine_override) {
  sim::EngineConfig cfg;
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
  cfg.net.message_latency_s = sc.engine.message_latency.value();
  cfg.net.message_overhead_s = sc.engine.message_overhead.value();
  cfg.flow_event_tolerance = sc.engine.flow_event_tolerance;
  cfg.flow_sharing = sc.engine.flow_sharing == FlowSharingKind::kPerFlow
                         ? sim::FlowSharing::kPerFlow
                         : sim::FlowSharing::kPerCollective;
  cfg.compute.launch_overhead = sc.engine.launch_overhead;
  cfg.compute.interference = sc.engine.interference;
  cfg.precision = sc.model.dtype;
  apply_calibration(cfg, sc);
  return cfg;
}

}  // namespace moesim::app
