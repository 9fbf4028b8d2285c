// a2a: linear | 2dh | 3dh | auto (docs/strategy-specs.md §2; Tutel §3.4). auto predicts the
// algorithms' time for this iteration's all-to-all chunk (dispatch bytes per rank / pipeline
// degree, under the decision's parallel degree) with the cost model's closed forms and picks the
// smaller; 2DH wins when per-peer messages are small (large P, small S) and loses at small scale
// with large messages, where its two stride copies and two phases cost more than the messages they
// merge.
#pragma once

#include <vector>

#include "core/plan.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies {

/// The all-to-all algorithms the strategy's a2a role allows on this EP group, for the decision
/// so far: linear / 2dh / 3dh alone (InputError at strategies[i].a2a when it cannot run: 2dh on
/// a group that is not node-aligned, 3dh on one without several leaf groups of several nodes, or
/// 3dh with a routed all_to_allv dispatch, which has no 3dh form); auto: linear and whichever of
/// 2dh and 3dh can run (3dh only for the padded all_to_all).
std::vector<CollectiveAlgo> a2a_candidates(const StrategyContext& ctx, const Decision& decision);

/// The fastest of `algos` for `bytes_per_rank`; the earlier on ties (linear first).
CollectiveAlgo fastest_a2a(const CostModel& cost, Bytes bytes_per_rank,
                           const std::vector<CollectiveAlgo>& algos);

class A2aStrategy final : public Strategy {
 public:
  explicit A2aStrategy(A2aRole role) : role_(role) {}
  std::string_view name() const override { return "a2a"; }
  /// Throws InputError (strategies[i].a2a) for 2dh on an EP group that is not node-aligned.
  void decide(const StrategyContext& ctx, Decision& decision) override;

 private:
  A2aRole role_;
};

}  // namespace moesim::strategies
