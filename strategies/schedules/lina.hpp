// Lina's prioritised all-to-all for training (docs/strategy-specs.md §6; docs/schedules.md) and its
// two baselines, as plan transformations the engine's priority gate (sim/engine.hpp) executes:
//
//  lina         every gradient all-reduce is cut into micro-ops of at most `micro_op` bytes, one
//               bucket at a time (a micro-op never mixes two gradients), each with priority -1
//               (yielding); every all-to-all has priority +1, and so has the backward compute
//               that feeds an all-to-all (decode backward, the expert's last backward GEMM), so
//               no micro-op launches once that computation starts. A running micro-op is never
//               preempted.
//  fair         the same micro-ops, priority 0: all-to-all and all-reduce share the NICs max-min
//               fairly (no coordination).
//  between_a2a  the same micro-ops, priority 0, but an MoE layer's first backward all-to-all
//               waits for every all-reduce launched before it: all-reduce runs only between
//               pairs of all-to-alls (the fixed rule Lina compares with).
#pragma once

#include <cstdint>
#include <vector>

#include "core/plan.hpp"
#include "core/run_result.hpp"
#include "core/scenario.hpp"
#include "strategies/plan_builder.hpp"

namespace moesim::strategies::schedules {

/// lina, fair, between_a2a.
bool is_lina(ScheduleRole r);

/// Number of micro-ops an all-reduce of `bytes` is cut into (>= 1).
int lina_micro_op_count(double bytes, Bytes micro_op);

/// Priority of a gradient all-reduce micro-op under `r` (-1 for lina, else 0).
int lina_allreduce_priority(ScheduleRole r);

/// Sets the all-to-all and pre-all-to-all compute priorities (lina) and the between_a2a deps.
/// grad_before[i] = how many entries of index.gradient_sync existed when MoE layer i's backward
/// began (the builder records it).
void apply_lina(Plan& plan, const PlanIndex& index, ScheduleRole r,
                const std::vector<std::size_t>& grad_before);

/// The scenario with `pack` times the experts per GPU: parallelism.ep / pack, dp * pack,
/// model.experts_per_gpu * pack (E, P and the per-expert capacity unchanged). pack must divide ep.
Scenario packed_scenario(const Scenario& sc, int pack);

/// Lina's plan knobs for one iteration (Lina §4.2):
///  - all-to-all micro-ops: pipeline degree r = ceil(dispatch bytes / micro_op), at most dC, when
///    the pipeline role left r = 1;
///  - expert packing: starting at p = 1, double p while the FFN micro-op (both expert GEMMs of
///    one chunk, CostModel roofline) is shorter than the all-to-all micro-op (closed-form linear
///    all-to-all of one chunk on the packed EP group), 2p <= max_pack (Lina: 2), 2p divides ep
///    and ep / 2p >= 2 (ours: an all-to-all remains). max_pack = 1: no packing.
struct LinaChoice {
  int pipeline_degree = 1;
  int expert_pack = 1;
  double ffn_micro_s = 0;  // at the chosen pack
  double a2a_micro_s = 0;
};
LinaChoice lina_choose(const Scenario& sc, const topology::Topology& topo, std::int64_t capacity,
                       Bytes micro_op, LayoutRole layout, int max_pack, int pipeline_degree);

/// Pipelining efficiency (Lina §4.2): the share of the time an all-to-all is active on rank 0
/// during which its compute stream is busy too, over the MoE layers' all-to-alls.
double pipelining_efficiency(const Plan& plan, const PlanIndex& index, const RunResult& result);

}  // namespace moesim::strategies::schedules
