// The iteration loop shared by simulation and real execution (docs/design.md §1): sample the
// workload, let the strategy stack decide, build the Plan, run it on a backend, feed the measured
// time back to the adaptive strategies. Only the Backend differs between `simulate` and `exec`.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/run_result.hpp"
#include "core/scenario.hpp"
#include "strategies/decision.hpp"
#include "strategies/memory.hpp"
#include "strategies/plan_builder.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::workload {
class SampleCache;
}  // namespace moesim::workload

namespace moesim::strategies {

/// Runs a plan and reports what happened: sim::run_plan, or the real executor.
using Backend = std::function<RunResult(const Plan&)>;

struct IterationRecord {
  int index = 0;
  double capacity_factor = 0;
  Decision decision;
  double step_time_s = 0;       // makespan of the step
  double moe_layer_time_s = 0;  // mean over MoE layers of (last op end - first op start), fwd+bwd
  // All-to-all time per rank: the dispatch and combine collectives' spans, each counted for the
  // ranks it runs on, averaged over the plan's ranks (a pipeline stage's for its own stage).
  double a2a_s = 0;
  double allreduce_s = 0;
  double compute_s = 0;
  double exposed_comm_s = 0;
  /// The whole breakdown of the run (RunResult::breakdown): the compute classes among it.
  Breakdown breakdown;
  std::int64_t dropped_tokens = 0;
  /// Per-GPU memory of this iteration's layout and decision at its largest MoE layer's dC.
  MemoryEstimate memory;
  /// Inference expert placement of this batch (docs/strategy-specs.md §7), when the scenario uses
  /// it.
  std::optional<InferenceRecord> inference;
};

struct StackRun {
  std::string strategy;  // StrategySpec::name
  std::vector<IterationRecord> iterations;
  RunResult last_result;  // of the last iteration (for traces and breakdowns)
  BuiltPlan last_plan;
  double gpu_memory_bytes = 0;  // the cluster's GPU memory (catalog or inline), for the estimate
  // What tokens/s/GPU, model FLOP/s/GPU and MFU need (strategies/model_flops.hpp), from the whole
  // scenario and its GPU, so every writer of a run derives the same figures from its step time.
  double tokens_per_step = 0;
  double model_flops_per_token = 0;  // training: forward + backward; inference: forward
  bool training = true;
  double gpu_peak_flops_per_s = 0;  // dense peak for model.dtype (gemm_peak_for), 0 if unknown
};

/// The decision `spec`'s stack takes at iteration 0 (no history) when dC = `capacity`, without
/// sampling a workload or building a plan (Lina's expert packing, the parallel degree). Throws
/// InputError where the stack cannot apply.
Decision first_decision(const Scenario& sc, const StrategySpec& spec,
                        const topology::Topology& topo, std::int64_t capacity);
/// The same at capacity factor `f` given (no workload generator is built: `tune` prices
/// thousands of layouts this way, and building one costs a pass over every GPU's EP group).
Decision first_decision(const Scenario& sc, const StrategySpec& spec,
                        const topology::Topology& topo, std::int64_t capacity, double f);

/// The per-GPU memory estimate `run_stack(sc, spec, topo, ..., iterations)` records for the
/// iteration that needs the most, without building or running a plan: the same decision and
/// the same sampled dC (a dropless layer's dC is its sampled largest count), through the same
/// estimate_memory. What `moesim validate` and `tune` print, so they agree with simulate's
/// memory_bytes. Adaptive stacks decide every iteration here without the history a run
/// observes, so past iteration 0 their decision (and estimate) may differ from the run's.
MemoryEstimate planned_memory(const Scenario& sc, const StrategySpec& spec,
                              const topology::Topology& topo, int iterations,
                              workload::SampleCache* cache = nullptr);

/// Runs `iterations` iterations of the stack described by `spec`. The workload is sampled from
/// the scenario's seed, so every stack of one scenario sees the same token routing. `cache`
/// (optional) shares the sampled counts with other runs of the same workload shape (stacks of
/// one point, sweep points that differ in M or H, ...); the results do not depend on it.
/// `for_execution`: the plans are run by the real backend (`moesim exec`), so routed dispatches
/// carry their expert split (Decision::expert_routing); simulated results do not depend on it.
StackRun run_stack(const Scenario& sc, const StrategySpec& spec, const topology::Topology& topo,
                   const Backend& backend, int iterations, workload::SampleCache* cache = nullptr,
                   bool for_execution = false);

}  // namespace moesim::strategies
