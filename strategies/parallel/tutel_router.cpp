#include "strategies/parallel/tutel_router.hpp"

namespace moesim::strategies {

int tutel_router_degree(int shards, Bytes dispatch, Bytes expert_parameters) {
  if (shards <= 1) return 1;
  return 2.0 * (shards - 1) * dispatch.value() < expert_parameters.value() ? shards : 1;
}

void TutelRouterStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  const int n = ctx.scenario.model.expert_shards();
  const Bytes dispatch = ctx.cost.layer_shape(ctx.capacity, 1).dispatch_bytes;
  decision.parallel_degree = tutel_router_degree(n, dispatch, ctx.cost.expert_parameter_bytes());
}

}  // namespace moesim::strategies
