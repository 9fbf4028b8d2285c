#include "strategies/a2a_select.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

namespace moesim::strategies {

namespace {
// 2dh and deepep both exchange between node blocks of the EP group (k2dh's applicability).
void require_node_aligned(const StrategyContext& ctx, std::string_view algo) {
  const bool spread = ctx.scenario.parallelism.ep > 1;  // one EP rank: nothing to exchange
  if (spread && !ctx.cost.a2a_applicable(CollectiveAlgo::k2dh))
    throw_role_error(ctx, "a2a",
                     fmt::format("{} needs EP groups made of whole nodes (P = m * n with the same "
                                 "m GPUs of every node), found a group that is not node-aligned",
                                 algo));
}
}  // namespace

std::vector<CollectiveAlgo> a2a_candidates(const StrategyContext& ctx, const Decision& decision) {
  const bool spread = ctx.scenario.parallelism.ep > 1;  // one EP rank: nothing to exchange
  switch (ctx.spec.a2a) {
    case A2aRole::kLinear:
      return {CollectiveAlgo::kLinear};
    case A2aRole::k2dh:
      require_node_aligned(ctx, "2dh");
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
    case A2aRole::kDeepep: {
      // DeepEP's normal dispatch: each token crosses the fabric once per destination node (to
      // the GPU on its own rail there), which forwards it over NVLink once to every GPU holding
      // one of its experts; the combine reduces on that GPU and returns once per node. It needs
      // the sampled tokens' destination sets (workload::LayerDispatch::distinct), so the token
      // split must be the sampled one: dropless, unrouted, unsharded, not an inference placement.
      const Scenario& sc = ctx.scenario;
      const auto dist = sc.workload.routing.distribution;
      if (dist == RoutingDistribution::kTrace || dist == RoutingDistribution::kCorrelated)
        throw_role_error(
            ctx, "a2a",
            "deepep needs each token's expert set, which sampled routing (uniform, "
            "zipf, dirichlet, balanced) draws and a trace or correlated routing does not");
      // Balanced routing gives no (GPU, expert) pair more than ceil(k S / E) <= dC tokens at
      // f >= 1, so its capacity dispatch drops nothing and is the dropless one.
      const bool dropless = ctx.capacity_factor == 0 ||
                            (dist == RoutingDistribution::kBalanced && ctx.capacity_factor >= 1);
      if (!dropless)
        throw_role_error(ctx, "a2a",
                         fmt::format("deepep is a dropless dispatch; found capacity factor {}, "
                                     "expected model.capacity_factor: 0 (or >= 1 with "
                                     "workload.routing.distribution: balanced, which then drops "
                                     "nothing)",
                                     ctx.capacity_factor));
      if (ctx.spec.routing != RoutingRole::kEven || ctx.spec.inference != InferenceRole::kBaseline)
        throw_role_error(ctx, "a2a",
                         "deepep sends the tokens as the gate chose them; it cannot follow a "
                         "routing or inference role that moves tokens (use routing: even)");
      if (ctx.spec.pipeline != PipelineRole::kDegree)
        throw_role_error(ctx, "a2a",
                         "deepep's cost is not in the padded all_to_all model that pipemoe and "
                         "tutel_online search; expected a fixed pipeline degree");
      if (sc.model.expert_shards() != 1 || ctx.spec.parallel != ParallelRole::kP1)
        throw_role_error(ctx, "a2a",
                         "deepep sends whole tokens to whole experts; expected unsharded experts "
                         "and parallel: p1");
      require_node_aligned(ctx, "deepep");
      return {CollectiveAlgo::kDeepep};
    }
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
    if (role_ == A2aRole::kDeepep) decision.variable_dispatch = true;
    return;
  }
  const int r = std::max(decision.pipeline_degree, 1);
  const std::int64_t cap = (ctx.capacity + r - 1) / r * r;  // the workload rounds dC to r
  const Bytes chunk =
      ctx.cost.layer_shape(cap, decision.parallel_degree).dispatch_bytes / static_cast<double>(r);
  decision.a2a = fastest_a2a(ctx.cost, chunk, algos);
}

}  // namespace moesim::strategies
