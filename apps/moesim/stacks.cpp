#include "apps/moesim/stacks.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "core/error.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

std::vector<StrategySpec> select_strategies(const Scenario& sc,
                                            const std::vector<std::string>& names) {
  if (names.empty()) return sc.strategies;
  std::vector<StrategySpec> out;
  for (const auto& n : names) {
    const StrategySpec* s = sc.find_strategy(n);
    if (!s) {
      std::string known;
      for (const auto& k : sc.strategies) known += (known.empty() ? "" : ", ") + k.name;
      throw InputError(
          fmt::format("--strategy: found '{}', expected one of the scenario's "
                      "strategies: {}",
                      n, known));
    }
    out.push_back(*s);
  }
  return out;
}

std::vector<StackOutcome> run_stacks(const Scenario& sc, const std::vector<StrategySpec>& specs,
                                     const topology::Topology& topo, const sim::EngineConfig& cfg,
                                     int iterations, const std::string& topology_name,
                                     bool progress, workload::SampleCache* cache,
                                     ProgressReporter* reporter) {
  std::vector<StackOutcome> out;
  // Every stack samples the same counts for (iteration, layer) (the runner's generator keys them
  // by the routing spec and the shape only), so a cache that holds all of them samples each once.
  // The cache drops its oldest entries beyond its budget, and the stacks visit the layers in the
  // same order, so one too small to hold the run would only cost memory: none then.
  std::unique_ptr<workload::SampleCache> own_cache;
  if (cache == nullptr && specs.size() > 1) {
    // Per row: k * E counts, and with a2a: deepep the distinct tokens per EP position and node.
    const bool distinct = workload::samples_distinct_destinations(sc);
    const double row = static_cast<double>(sc.model.top_k) * sc.num_experts() +
                       (distinct ? sc.parallelism.ep + sc.cluster.nodes : 0);
    const double bytes =
        static_cast<double>(iterations) * sc.model.num_moe_layers() * sc.num_gpus() * row * 4.0;
    if (bytes > 0 && bytes <= static_cast<double>(kStacksCacheMaxBytes)) {
      own_cache = std::make_unique<workload::SampleCache>(static_cast<std::size_t>(bytes) + 4096);
      cache = own_cache.get();
    }
  }
  // run_stack calls the backend once per iteration: the reporter's units.
  strategies::Backend backend = [&](const Plan& plan) {
    if (reporter == nullptr) return sim::run_plan(plan, topo, cfg);
    reporter->begin_unit();
    RunResult r = sim::run_plan(plan, topo, cfg);
    reporter->end_unit();
    return r;
  };
  for (const auto& spec : specs) {
    if (reporter)
      reporter->begin_group(progress ? spec.name + " on " + topology_name : spec.name, iterations);
    if (progress) {
      if (reporter) reporter->finish();  // a terminal's progress line would prefix this one
      std::fprintf(stderr, "moesim: %s on %s: %d iteration(s)...\n", spec.name.c_str(),
                   topology_name.c_str(), iterations);
    }
    auto t0 = std::chrono::steady_clock::now();
    StackOutcome o;
    o.run = strategies::run_stack(sc, spec, topo, backend, iterations, cache);
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    o.summary = summarize(o.run, topology_name, topo.num_gpus(), wall);
    out.push_back(std::move(o));
  }
  std::vector<RunSummary> rows;
  for (const auto& o : out) rows.push_back(o.summary);
  apply_speedups(rows, baseline_index(specs));
  for (size_t i = 0; i < out.size(); ++i) out[i].summary = rows[i];  // with the speedups
  return out;
}

}  // namespace moesim::app
