// Pipeline stages and micro-batches (parallelism.pp, model.micro_batches; docs/model.md,
// "Pipeline stages"): the 1F1B schedule of PipeDream-Flush / Megatron-LM, and the stitching of the
// per-stage plans (plan_builder.hpp, StagePlan) into the step's one Plan.
//
// Stage s of pp runs its micro-batches in the order
//   warm-up: F0 .. F(w-1) with w = min(pp - 1 - s, m), then F(w) B0 F(w+1) B1 .. (one forward,
//   one backward), then the cool-down backwards, B(m - w) .. B(m - 1),
// so at most pp - s micro-batches' activations are held at once (GPipe holds m). Inference runs
// the forwards only. Between neighbouring stages every rank sends its micro-batch's activations
// (S x M x bytes: forward) or their gradient (backward) to the rank at the same position of the
// next (previous) stage, as a two-rank all_to_allv on a stream of its own (one per direction and
// boundary parity, so a send never waits behind a receive of another boundary). An action's first
// ops wait for the previous action of the stage and for what it receives. The bubble is what the
// engine measures: with equal stages, (pp - 1) x (F + B) of idle time per stage.
#pragma once

#include <vector>

#include "core/scenario.hpp"
#include "strategies/plan_builder.hpp"

namespace moesim::strategies {

struct StageAction {
  bool backward = false;
  int micro_batch = 0;
  bool operator==(const StageAction&) const = default;
};

/// The 1F1B order of stage `stage` of `pp` with `micro_batches` micro-batches (above); training
/// false: the forwards only.
std::vector<StageAction> one_f_one_b(int pp, int stage, int micro_batches, bool training);

/// The step's plan from one StagePlan per stage (stages[s] built on sc.stage_scenario() for
/// stage s's blocks): every stage's plan instantiated once per micro-batch on ranks
/// [s * P / pp, (s + 1) * P / pp), in 1F1B order, with the stage-to-stage sends; gradient
/// all-reduces (the stage's PlanIndex::gradient_sync) only in the last micro-batch's backward.
/// Op labels get "mb{i}." in front when m > 1. The index lists every instance of every MoE layer.
BuiltPlan stitch_stages(const Scenario& sc, const std::vector<StagePlan>& stages);

}  // namespace moesim::strategies
