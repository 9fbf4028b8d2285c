// pipeline: <integer r> (docs/strategy-specs.md §3): a fixed pipeline degree, r = 1 being no
// pipelining.
#pragma once

#include "strategies/strategy.hpp"

namespace moesim::strategies {

class FixedPipelineStrategy final : public Strategy {
 public:
  explicit FixedPipelineStrategy(int degree) : degree_(degree) {}
  std::string_view name() const override { return "pipeline_degree"; }
  /// Throws InputError (strategies[i].pipeline) when r < 1.
  void decide(const StrategyContext& ctx, Decision& decision) override;

 private:
  int degree_;
};

}  // namespace moesim::strategies
