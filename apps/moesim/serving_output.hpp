// `moesim simulate` on a scenario with a `serving:` section (docs/serving.md): every strategy's
// serving run, its table, JSON and CSV.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/scenario.hpp"
#include "sim/engine.hpp"
#include "strategies/serving/serving_engine.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

/// Instance backends on `cfg`'s engine (which must outlive them): the instance's simulation
/// topology, sim::run_plan on it, and the compute model's kernel times.
serving::MakeInstanceBackend instance_backends(const sim::EngineConfig& cfg);

/// Runs `specs` on the scenario's serving pools, each iteration priced by `cfg`'s engine on the
/// instance's nodes.
std::vector<serving::ServingReport> run_serving_stacks(const Scenario& sc,
                                                       const std::vector<StrategySpec>& specs,
                                                       const topology::Topology& cluster,
                                                       const sim::EngineConfig& cfg);

/// The pools (once) and one row per strategy: latency percentiles, throughput per node and per
/// user, SLO attainment, KV utilisation.
void print_serving_table(const Scenario& sc, const std::vector<serving::ServingReport>& reports);

nlohmann::ordered_json serving_json(const Scenario& sc, const sim::EngineConfig& cfg,
                                    const std::vector<serving::ServingReport>& reports);

/// One row per strategy (a header first).
void write_serving_csv(std::ostream& os, const Scenario& sc,
                       const std::vector<serving::ServingReport>& reports);

}  // namespace moesim::app
