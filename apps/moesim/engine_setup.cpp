#include "apps/moesim/engine_setup.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace moesim::app {

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
  cfg.compute.launch_overhead = sc.engine.launch_overhead;
  cfg.compute.interference = sc.engine.interference;
  cfg.precision = sc.model.dtype;
  return cfg;
}

}  // namespace moesim::app
  cfg.flow_event_tolerance = sc.engine.flow_event_tolerance;
