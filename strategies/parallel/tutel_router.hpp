// parallel: tutel_router (docs/strategy-specs.md §4; Tutel §3.2, Table 5): per iteration, choose P2
// (EP+MP, r = n) when repeating the tokens costs less communication than gathering the parameters:
//   2 * (n - 1) * |dispatch| < |local expert parameters|
// else P1 (EP+DP, r = 1). |dispatch| = bytes one GPU sends in the dispatch all-to-all without
// repetition (E * dC * M * b, so it moves with the capacity factor f); the 2 (n - 1) counts the
// extra copies of those tokens in dispatch and combine. |local expert parameters| (ours: the
// whole expert, 2 * M * H * b) is what P1's all-gather materialises on every GPU. Both modes
// keep the same parameter placement, so switching every iteration costs nothing.
#pragma once

#include "core/units.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies {

/// The router's rule: n (P2) or 1 (P1); 1 whenever n <= 1.
int tutel_router_degree(int shards, Bytes dispatch, Bytes expert_parameters);

class TutelRouterStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "tutel_router"; }
  void decide(const StrategyContext& ctx, Decision& decision) override;
};

}  // namespace moesim::strategies
