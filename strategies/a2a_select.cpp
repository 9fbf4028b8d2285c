#include "strategies/a2a_select.hpp"

#include <algorithm>

namespace moesim::strategies {

CollectiveAlgo fastest_a2a(const CostModel& cost, Bytes bytes_per_rank) {
  if (!cost.a2a_applicable(CollectiveAlgo::k2dh)) return CollectiveAlgo::kLinear;
  const Seconds lin = cost.a2a_time(CollectiveAlgo::kLinear, bytes_per_rank);
  const Seconds two = cost.a2a_time(CollectiveAlgo::k2dh, bytes_per_rank);
  return two < lin ? CollectiveAlgo::k2dh : CollectiveAlgo::kLinear;
}

void A2aStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  switch (role_) {
    case A2aRole::kLinear:
      decision.a2a = CollectiveAlgo::kLinear;
      return;
    case A2aRole::k2dh:
      if (ctx.scenario.parallelism.ep > 1 && !ctx.cost.a2a_applicable(CollectiveAlgo::k2dh))
        throw_role_error(ctx, "a2a",
                         "2dh needs EP groups made of whole nodes (P = m * n with the same m "
                         "GPUs of every node), found a group that is not node-aligned");
      decision.a2a = CollectiveAlgo::k2dh;
      return;
    case A2aRole::kAuto: {
      const int r = std::max(decision.pipeline_degree, 1);
      const std::int64_t cap = (ctx.capacity + r - 1) / r * r;  // the workload rounds dC to r
      const Bytes chunk = ctx.cost.layer_shape(cap, decision.parallel_degree).dispatch_bytes /
                          static_cast<double>(r);
      decision.a2a = fastest_a2a(ctx.cost, chunk);
      return;
    }
  }
}

}  // namespace moesim::strategies
