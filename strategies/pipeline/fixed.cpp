#include "strategies/pipeline/fixed.hpp"

#include <fmt/format.h>

namespace moesim::strategies {

void FixedPipelineStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  if (degree_ < 1)
    throw_role_error(ctx, "pipeline", fmt::format("degree {}, expected an integer >= 1", degree_));
  // The workload rounds dC up to a multiple of r, so any r >= 1 splits evenly.
  decision.pipeline_degree = degree_;
}

}  // namespace moesim::strategies
