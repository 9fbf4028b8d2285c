// --check of a MoE layer's gradients. The backward itself is the layer program's
// (exec/layer_program.hpp, run_backward_step): the layer's output gradient dY (S x M) is seeded
// (make_grad_output, exec/moe_data.hpp), so no loss function is needed, and the program leaves
// dX, dWgate and the experts' dW1 / dW2 in the layer's buffers. This file compares them with the
// independent reference (reference_backward_seeded), which recomputes the layer with plain loops
// in double.
#pragma once

#include <cstdint>
#include <vector>

#include "core/plan.hpp"
#include "exec/communicator.hpp"
#include "exec/moe_data.hpp"

namespace moesim::exec {

class MpiSession;

/// What the plan says of one MoE layer's backward on one rank: how many times it runs this step
/// (model.micro_batches: the parameter gradients accumulate over the passes), its EP group (the
/// forward dispatch's) and the experts' gradient all-reduce (group and micro-op count; none
/// without DP replicas of the experts).
struct LayerBackwardPlan {
  int passes = 0;      // backward decodes of the layer on this rank
  int sync_parts = 0;  // micro-ops of the experts' gradient all-reduce (Lina splits it)
  std::vector<int> ep_group;
  std::vector<int> mp_group;  // Parm's MP all-reduce of the expert gradients (disjoint layout)
  std::vector<int> dp_group;
};
LayerBackwardPlan layer_backward_plan(const Plan& plan, int block, int rank);

/// A routing unit the reference differentiates: the rows one gate call saw (Parm: the ESP group's
/// gathered tokens, or one MP share of the rank's), their output gradient, and which of its dX
/// rows are this rank's.
struct GradUnit {
  std::vector<float> tokens, dy;  // rows x M
  int rows = 0;
  int dx_first = 0, dx_rows = 0;  // its dX rows [dx_first, + dx_rows) are this rank's next ones
  bool own = true;  // this rank's gate and expert contributions come from it (exactly one unit)
};

/// One layer's gradients on this rank, as the program left them.
struct LayerGradients {
  int moe = 0;
  int expert_first = 0;   // this rank owns experts [expert_first, + local_experts)
  int local_experts = 0;  // ... (dE; 1 on a sharded layout)
  int hidden_first = 0;   // ... hidden units [hidden_first, + hidden_cols) of each (0, H: all;
  int hidden_cols = 0;    // a sharded layout's 1/n shard)
  int capacity = 0;       // capacity routing's C (the reference's capacity rule)
  const std::vector<int>* routed_expert = nullptr;  // plan-routed: each entry's expert, -1 dropped
  // deepep: the expert GPUs recompute the gate's weights from the rows they receive, so dWgate
  // lands where the rows went: the EP group's sum is compared (dX still per rank).
  bool gate_on_targets = false;
  const LayerBackwardPlan* plan = nullptr;
  // Empty: the rank's own S tokens. Otherwise this rank's dX is the units' dX rows in order.
  std::vector<GradUnit> units;
  // The share of its own unit's expert contributions this rank's experts see: Parm S2 splits the
  // unit's slots over the mp ranks that hold the same tokens (1 / mp), summed back by the MP
  // all-reduce or, in the overlapped layout, by the fused group.
  double dw_share = 1;
  const std::vector<float>* dx = nullptr;       // S x M
  const std::vector<float>* dgate_w = nullptr;  // M x E
  const std::vector<float>* dw = nullptr;       // [dW1 of each owned (M x cols) | dW2 (cols x M)]
};

/// The gradient check of one layer of one iteration (identical on every rank).
struct GradCheck {
  int iteration = 0;
  int layer = 0;
  long long compared = 0;  // gradient values compared (dX, dWgate, dW1, dW2; all ranks)
  long long wrong = 0;
  double max_abs_error = 0;
};

/// --check of the layer's gradients (a collective over every rank): per rank dX of its own tokens
/// and dWgate of its own tokens (gate_on_targets: the EP group's sum of both sides) vs the
/// reference; per expert the reference contributions of every
/// rank summed over the EP group (and the MP and DP groups when the plan all-reduces the expert
/// gradients over them), compared on the expert's owner, all times the passes. `tol`: |g - ref| <=
/// tol * (1 + |ref|).
GradCheck check_backward_layer(Communicator& comm, const MpiSession& session,
                               const LayerGradients& g, const MoeShape& s, std::uint64_t seed,
                               int iteration, int key_rank, double tol);

/// A rank's part in the gradient check of a layer it does not run (another pipeline stage's):
/// the same global collectives as check_backward_layer, in the same order, contributing nothing.
GradCheck idle_backward_check(const MpiSession& session, int iteration, int layer);

}  // namespace moesim::exec
