#include "strategies/parallel/parallel.hpp"

#include <fmt/format.h>

namespace moesim::strategies {

void FixedParallelStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  const int n = ctx.scenario.model.expert_shards();
  int r = 1;
  switch (role_) {
    case ParallelRole::kP1:
      r = 1;
      break;
    case ParallelRole::kP2:
      r = n;
      break;
    case ParallelRole::kDegree:
    case ParallelRole::kTutelRouter:
      r = degree_;
      break;
  }
  if (r < 1 || n % r != 0)
    throw_role_error(ctx, "parallel",
                     fmt::format("degree r = {} must be a divisor of the expert shard count n = {} "
                                 "(model.experts_per_gpu = {})",
                                 r, n, ctx.scenario.model.experts_per_gpu));
  // Unsharded experts have nothing to switch (n = 1 makes every valid r equal to 1).
  decision.parallel_degree = n == 1 ? 1 : r;
}

}  // namespace moesim::strategies
