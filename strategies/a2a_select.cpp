#include "strategies/a2a_select.hpp"

#include <algorithm>

namespace moesim::strategies {

std::vector<CollectiveAlgo> a2a_candidates(const StrategyContext& ctx, const Decision& decision) {
  const bool spread = ctx.scenario.parallelism.ep > 1;  // one EP rank: nothing to exchange
  switch (ctx.spec.a2a) {
    case A2aRole::kLinear:
      return {CollectiveAlgo::kLinear};
    case A2aRole::k2dh:
      if (spread && !ctx.cost.a2a_applicable(CollectiveAlgo::k2dh))
        throw_role_error(ctx, "a2a",
                         "2dh needs EP groups made of whole nodes (P = m * n with the same m "
                         "GPUs of every node), found a group that is not node-aligned");
      return {CollectiveAlgo::k2dh};
    case A2aRole::k3dh:
      if (decision.variable_dispatch)
        throw_role_error(ctx, "a2a",
                         "3dh is defined for the padded all_to_all; this strategy's routed "
                         "dispatch is an all_to_allv (use linear, 2dh or auto)");
      if (spread && !ctx.cost.a2a_applicable(CollectiveAlgo::k3dh))
        throw_role_error(ctx, "a2a",
                         "3dh needs node-aligned EP groups spanning several leaf switches with "
                         "the same number (> 1) of the group's nodes under each");
      return {CollectiveAlgo::k3dh};
    case A2aRole::kAuto: {
      std::vector<CollectiveAlgo> algos = {CollectiveAlgo::kLinear};
      if (ctx.cost.a2a_applicable(CollectiveAlgo::k2dh)) algos.push_back(CollectiveAlgo::k2dh);
      if (!decision.variable_dispatch && ctx.cost.a2a_applicable(CollectiveAlgo::k3dh))
        algos.push_back(CollectiveAlgo::k3dh);
      return algos;
    }
  }
  return {CollectiveAlgo::kLinear};
}

CollectiveAlgo fastest_a2a(const CostModel& cost, Bytes bytes_per_rank,
                           const std::vector<CollectiveAlgo>& algos) {
  CollectiveAlgo best = algos.front();
  Seconds best_s = cost.a2a_time(best, bytes_per_rank);
  for (std::size_t i = 1; i < algos.size(); ++i) {
    const Seconds t = cost.a2a_time(algos[i], bytes_per_rank);
    if (t < best_s) best = algos[i], best_s = t;
  }
  return best;
}

void A2aStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  const std::vector<CollectiveAlgo> algos = a2a_candidates(ctx, decision);
  if (role_ != A2aRole::kAuto) {
    decision.a2a = algos.front();
    return;
  }
  const int r = std::max(decision.pipeline_degree, 1);
  const std::int64_t cap = (ctx.capacity + r - 1) / r * r;  // the workload rounds dC to r
  const Bytes chunk =
      ctx.cost.layer_shape(cap, decision.parallel_degree).dispatch_bytes / static_cast<double>(r);
  decision.a2a = fastest_a2a(ctx.cost, chunk, algos);
}

}  // namespace moesim::strategies
