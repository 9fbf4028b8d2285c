// What the strategy stack decides for one iteration (docs/design.md §1): the knobs the plan builder
// turns into a Plan. Every strategy module fills its part; a role left out keeps the baseline
// value.
#pragma once

#include <memory>
#include <string>

#include "core/plan.hpp"
#include "core/scenario.hpp"
#include "strategies/inference/types.hpp"

namespace moesim::strategies {

struct Decision {
  /// Chunks along the capacity dimension for dispatch / expert / combine (docs/strategy-specs.md
  /// §3); r >= 1.
  int pipeline_degree = 1;
  /// All-to-all algorithm of dispatch and combine: kLinear or k2dh (auto is resolved by the
  /// a2a strategy before building, so the plan says what runs).
  CollectiveAlgo a2a = CollectiveAlgo::kLinear;
  /// Expert buffer layout (Tutel §3.1): plain (W, dE, dC, M) runs W*dE small GEMMs; flexible
  /// (dE, C, M) runs dE large ones.
  LayoutRole layout = LayoutRole::kPlain;
  /// Parallel mode for n-sharded experts (docs/strategy-specs.md §4): token repeat factor r, a
  /// divisor of the shard count n. r = 1 is P1 (EP+DP, ZeRO-style parameter all-gather), r = n is
  /// P2 (EP+MP, tokens repeated n times, partial outputs summed).
  int parallel_degree = 1;
  /// Communication schedule (Parm, Lina): later milestones.
  ScheduleRole schedule = ScheduleRole::kNone;
  /// lina / fair / between_a2a: gradient all-reduce micro-op size (strategy's lina.micro_op).
  Bytes lina_micro_op{30e6};
  /// Lina expert packing: experts per GPU multiplied by this (EP group / p, DP group x p).
  int expert_pack = 1;
  /// Dispatch and combine move the routed counts (all_to_allv of the workload's dispatch matrix,
  /// expert compute scaled by each rank's received tokens) instead of the padded all_to_all. Set
  /// by the routing role when it is not even (TA-MoE, FasterMoE hir: docs/strategy-specs.md §8).
  bool variable_dispatch = false;
  /// Inference expert placement (docs/strategy-specs.md §7, strategies/inference/): per MoE layer,
  /// the tokens each GPU sends to each GPU (replacing the placement-by-id dispatch; needs
  /// variable_dispatch) and the expert weights moved. Null: experts stay where the ids put them.
  std::shared_ptr<const InferencePlan> inference;
  /// Attach to every routed dispatch the expert split behind its matrix (CollectiveSpec::
  /// expert_routing), which the real backend's data path needs to know which expert each token
  /// is for; a P x E count matrix per MoE layer (128 MiB at 4,096 GPUs x 8,192 experts), so the
  /// simulator, which never reads it, leaves it off. Set by run_stack(for_execution = true).
  bool expert_routing = false;

  /// "r=2 a2a=2dh layout=flexible parallel=1" — stable, for tables and JSON.
  std::string describe() const;
};

}  // namespace moesim::strategies
