// a2a: linear | 2dh | auto (STRATEGIES §2; Tutel §3.4). auto predicts both algorithms' time for
// this iteration's all-to-all chunk (dispatch bytes per rank / pipeline degree, under the
// decision's parallel degree) with the cost model's closed forms and picks the smaller; 2DH wins
// when per-peer messages are small (large P, small S) and loses at small scale with large
// messages, where its two stride copies and two phases cost more than the messages they merge.
#pragma once

#include "core/plan.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies {

/// The faster of linear and 2dh (2dh only if it can run) for `bytes_per_rank`; linear on ties.
CollectiveAlgo fastest_a2a(const CostModel& cost, Bytes bytes_per_rank);

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
