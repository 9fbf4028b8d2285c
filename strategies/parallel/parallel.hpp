// parallel: p1 | p2 | <integer r> (docs/strategy-specs.md §4; Tutel §3.2). For an expert sharded
// over n GPUs (model.experts_per_gpu = -n) the token repeat factor r in divisors(n): r = 1 is P1
// (EP+DP, ZeRO-style: each GPU all-gathers the expert's parameters), r = n is P2 (EP+MP: tokens
// repeated n times, hidden dimension split n ways), an intermediate r repeats tokens r times and
// gathers parameters within groups of n / r. Experts that are not sharded (n = 1) always run
// r = 1, whatever the role says.
#pragma once

#include "core/scenario.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies {

class FixedParallelStrategy final : public Strategy {
 public:
  /// role kP1, kP2 or kDegree (then `degree` is r).
  FixedParallelStrategy(ParallelRole role, int degree) : role_(role), degree_(degree) {}
  std::string_view name() const override { return "parallel_fixed"; }
  /// Throws InputError (strategies[i].parallel) when r does not divide the shard count.
  void decide(const StrategyContext& ctx, Decision& decision) override;

 private:
  ParallelRole role_;
  int degree_;
};

}  // namespace moesim::strategies
