// Routing strategies (docs/strategy-specs.md §8): what a trained gate's dispatch pattern looks
// like.
//  - ta_moe: the count matrix of every EP group moves towards the TA-MoE target c-hat
//    (target.hpp) by `adherence` (0 = the sampled even routing, 1 = fully converged training);
//    each receiver's experts keep their sampled proportions, so experts stay balanced.
//  - faster_moe_hir: FasterMoE's hierarchical gate caps the share of a GPU's top-1 tokens that
//    leave its node at max_offnode_share; the excess goes to the experts of the own node.
// Both leave the tokens kept per sender unchanged (drops were decided by the sampled gate) and set
// Decision::variable_dispatch, so the plan moves the routed counts with all_to_allv.
#pragma once

#include <memory>
#include <span>

#include "core/scenario.hpp"
#include "strategies/routing/target.hpp"
#include "strategies/strategy.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::routing {

/// Moves the rows of `layer` whose GPUs form the EP group `group_ranks` towards `target` (group
/// positions): new volume to position b = (1 - adherence) * current + adherence * c-hat_ab * sent,
/// rounded so that every row keeps its total; within b, the experts get the volume in proportion
/// to their sampled counts (equal split when all are 0). `demanded` follows `kept`.
void route_towards_target(workload::LayerDispatch& layer, std::span<const int> group_ranks,
                          const workload::ExpertPlacement& placement, const TargetPattern& target,
                          double adherence);

/// FasterMoE hir: for every row of the group, at most max_offnode_share of its first-choice
/// tokens (the workload merges choices: taken as 1/top_k of the counts) go to experts on other
/// nodes; the excess moves to the own node's GPUs in proportion to their counts.
void cap_offnode_share(workload::LayerDispatch& layer, std::span<const int> group_ranks,
                       const workload::ExpertPlacement& placement, const topology::Topology& topo,
                       double max_offnode_share);

/// Share of the kept routing choices of `layer` that leave their GPU's node.
double offnode_share(const workload::LayerDispatch& layer,
                     const workload::ExpertPlacement& placement, std::span<const int> group_ranks,
                     const topology::Topology& topo);

/// The routing module of `spec` (ta_moe or faster_moe_hir).
std::unique_ptr<strategies::Strategy> make_routing_strategy(const StrategySpec& spec);

}  // namespace moesim::routing
