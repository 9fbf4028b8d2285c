// Running the strategy stacks of a scenario on the simulator: shared by `simulate` and `compare`.
#pragma once

#include <string>
#include <vector>

#include "apps/moesim/progress.hpp"
#include "apps/moesim/report.hpp"
#include "core/scenario.hpp"
#include "sim/engine.hpp"
#include "strategies/runner.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::app {

/// The scenario's strategies, or the subset named by `names` in the order given (InputError for
/// an unknown name, listing the known ones).
std::vector<StrategySpec> select_strategies(const Scenario& sc,
                                            const std::vector<std::string>& names);

struct StackOutcome {
  strategies::StackRun run;
  RunSummary summary;
};

/// Runs every spec for `iterations` iterations on `topo` with the simulator configured by cfg;
/// fills speedups against the baseline among specs. `progress`: a line on stderr as each strategy
/// starts. `reporter` (optional) gets each strategy as a group, named "STRATEGY on TOPOLOGY" when
/// `progress` (compare's several topologies) and "STRATEGY" otherwise, and each iteration as a
/// unit; a Ctrl-C stops the run with sim::Interrupted. `cache` null with several specs: the
/// specs share a cache of their own when one can hold every sampled layer of the run (at most
/// kStacksCacheMaxBytes): the counts are identical, sampled once instead of once per strategy.
std::vector<StackOutcome> run_stacks(const Scenario& sc, const std::vector<StrategySpec>& specs,
                                     const topology::Topology& topo, const sim::EngineConfig& cfg,
                                     int iterations, const std::string& topology_name,
                                     bool progress, workload::SampleCache* cache = nullptr,
                                     ProgressReporter* reporter = nullptr);

/// The largest sample cache run_stacks makes for its specs (bytes).
inline constexpr std::size_t kStacksCacheMaxBytes = std::size_t{2} << 30;

}  // namespace moesim::app
