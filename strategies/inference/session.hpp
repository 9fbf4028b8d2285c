// One strategy's inference run (docs/strategy-specs.md §7): the batches of the correlated routing
// generator, the counts the plan builder needs, and, per batch and MoE layer, the expert placement
// of the strategy's `inference` role:
//  - baseline: uniform placement (E / W experts per GPU), the gate's routing as is;
//  - ideal: every GPU of the EP group processes the same number of tokens (each source spreads
//    its tokens evenly over the group), no weights move: the balanced bound;
//  - lina: phase 1 places from the path-profile estimate (weights prefetched while the earlier
//    layers run); after the gate an all-reduce of the actual counts checks the estimate, and if
//    the top-k popular experts differ (k = model.top_k) phase 2 re-places from the actual counts,
//    blocking the dispatch while the weights move.
//    (ours) Either phase keeps the placement it has when the new one is not predicted to lower
//    the busiest GPU's load by more than 5%: a change moves weights, for nothing on flat
//    popularity (where the top-k is noise and phase 2 would fire on almost every layer).
// The placement of a layer persists to the next batch (weights stay where they are).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/scenario.hpp"
#include "strategies/inference/correlated_routing.hpp"
#include "strategies/inference/path_profile.hpp"
#include "strategies/inference/placement.hpp"
#include "strategies/inference/types.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::inference {

/// True when the runs of `sc` go through the inference placement: model.mode inference and
/// either distribution correlated or some strategy with inference lina or ideal (then every
/// strategy of the scenario does, so all see the same tokens).
bool placement_active(const Scenario& sc);

/// Most experts one GPU may hold: 4 (Lina), or E / W when the baseline already holds more.
int max_experts_per_gpu(const Scenario& sc);

class InferenceSession {
 public:
  /// Throws InputError at the offending key when the scenario cannot be placed (training mode,
  /// dirichlet or trace routing, esp / mp > 1, sharded experts).
  InferenceSession(const Scenario& sc, const StrategySpec& spec);

  /// Draws batch `iteration` (kept until the next call).
  void generate(int iteration);
  /// The drawn batch's counts per MoE layer under capacity factor f (docs/strategy-specs.md §1), dC
  /// rounded up to a multiple of `capacity_multiple`.
  workload::IterationWorkload workload(int iteration, double f, int capacity_multiple) const;
  /// Places every MoE layer for the drawn batch; `work` holds its counts (maybe reshaped by a
  /// routing module). Adds to `rec`.
  std::shared_ptr<const strategies::InferencePlan> place(const workload::IterationWorkload& work,
                                                         strategies::InferenceRecord& rec);

  const RoutingBatch& batch() const { return batch_; }
  const PathProfile* profile() const { return profile_ ? &*profile_ : nullptr; }

 private:
  const Scenario& sc_;
  InferenceRole role_;
  CorrelatedRouting gen_;
  std::vector<std::vector<int>> groups_;  // EP groups (global ranks by position)
  RoutingBatch batch_;
  std::optional<PathProfile> profile_;
  std::vector<std::vector<Placement>> current_;  // [MoE layer][EP group]
};

}  // namespace moesim::inference
