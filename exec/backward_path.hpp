// The backward MoE layer on real data, host path, plain data path only (unsharded experts,
// esp = 1, padded all_to_all; exec/executor.hpp). The layer's output gradient dY (S x M) is seeded
// (make_grad_output, exec/moe_data.hpp), so no loss function is needed; every other input comes
// from the forward's saved activations. The plan's backward ops run in plan order:
//   L{b}.bwd.decode         dExpertOut (E, C, M) = weight * dY, dWeight = <dY, expert_out>
//   L{b}.bwd.combine.c{j}   the combine's backward all-to-all: dOut of chunk j to the experts
//   L{b}.bwd.expert.fc2.c{j} dHidden = dOut W2^T (masked by ReLU), dW2 += hidden^T dOut
//   L{b}.bwd.expert.fc1.c{j} dIn = dHidden W1^T, dW1 += in^T dHidden
//   L{b}.bwd.dispatch.c{j}  the dispatch's backward all-to-all: dIn back to the token owners
//   L{b}.bwd.encode         dX = sum over kept choices of dIn (encode_backward)
//   L{b}.bwd.gate           softmax backward of dWeight: dWgate = x^T dLogits, dX += dLogits Wg^T
//   L{b}.grad.expert_allreduce[.m{i}]  the sum of the DP replicas' real dW1 / dW2 (part i of n)
// Both all-to-alls go through the shared collective lowering (select_algorithm + run_phases) like
// the forward's. The GPU path, and plan-routed, sharded and Parm layers, keep running their
// backward on scratch buffers (the executor does not hand those to this file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "exec/communicator.hpp"
#include "exec/moe_data.hpp"

namespace moesim::topology {
class Topology;
}
namespace moesim::collectives {
struct CostContext;
}

namespace moesim::exec {

class MpiSession;
struct MoeLayerPlan;

/// What a backward MoE op or expert-gradient collective does, read from its role (Op::role; the
/// labels "L{block}.bwd.{what}[.c{j}]", "L{block}.grad.expert_allreduce[.m{i}]" are for people).
struct MoeBwdRef {
  // kGate, kEncode, kDecode, kDispatch, kFc1, kFc2, kCombine (a backward op of the plain data
  // path) or kExpertGradSync (the experts' DP all-reduce); kNone for every other op.
  OpRoleKind kind = OpRoleKind::kNone;
  int block = -1;
  int chunk = -1;  // 0-based (combine, fc2, fc1, dispatch)
  int micro = -1;  // Lina's micro-op index of expert_allreduce, -1 for the whole all-reduce
};
MoeBwdRef moe_bwd_ref(const Op& op);

/// The forward's saved activations of one plain MoE layer on this rank (views into the
/// executor's buffers; fp32). Token side: x, logits, routing, expert_out (E, C, M). Expert side,
/// per chunk j: chunk_in (W, dE, c_j, M) and hidden (W, dE, c_j, H) after the ReLU.
struct ForwardView {
  const MoeLayerPlan* plan = nullptr;
  const std::vector<float>* x = nullptr;
  const std::vector<float>* gate_w = nullptr;
  const std::vector<float>* logits = nullptr;
  const std::vector<float>* weight = nullptr;
  const std::vector<std::int32_t>* expert = nullptr;
  const std::vector<std::int32_t>* slot = nullptr;
  const std::vector<std::int32_t>* slot_entry = nullptr;
  const std::vector<float>* expert_out = nullptr;
  const std::vector<std::vector<float>>* w1 = nullptr;  // local experts, M x H
  const std::vector<std::vector<float>>* w2 = nullptr;  // local experts, H x M
  const std::vector<std::vector<float>>* chunk_in = nullptr;
  const std::vector<std::vector<float>>* hidden = nullptr;
};

/// One plain MoE layer's backward state on this rank.
struct BackwardLayer {
  std::vector<float> dy;               // S x M, seeded
  std::vector<float> grad_weight;      // S * k: dLoss / dWeight of every choice (0 if dropped)
  std::vector<float> grad_expert_out;  // (E, C, M), token side
  std::vector<float> grad_dispatched;  // (E, C, M), token side, filled chunk by chunk
  std::vector<std::vector<float>> chunk_dout, chunk_dhidden, chunk_din;  // expert side, per chunk
  std::vector<float> dx;                                                 // S x M
  std::vector<float> dgate_w;                // M x E, this rank's tokens only
  std::vector<std::vector<float>> dw1, dw2;  // local experts (after the DP all-reduce, if any)
  std::vector<std::vector<float>> w1t, w2t;  // transposed local weights (H x M, M x H)
  std::vector<int> ep_group;  // this rank's EP group (global ranks): {rank} without all-to-all
  std::vector<int> dp_group;  // the expert_allreduce group, empty when the plan has none
  int dp_parts = 0;           // micro-ops of the expert all-reduce (1 without Lina)
  int dp_parts_done = 0;
  bool decoded = false, encoded = false, gated = false;
  int fc1_done = 0;  // chunks whose fc1 backward ran
  // Backward passes of the layer this step (model.micro_batches): the parameter gradients (dW1,
  // dW2, dWgate) accumulate over them; dX is the last pass's.
  int passes = 0;
};

/// Sets up `bl` for the plan's layer (EP group, the expert all-reduce's group and micro-op count,
/// zeroed gradients). Called once per run before the layer's first backward op.
void begin_backward_layer(const Plan& plan, const MoeLayerPlan& lp, int rank, const MoeShape& s,
                          const ForwardView& fwd, BackwardLayer& bl);

/// Runs one backward op (or expert-gradient all-reduce) of the layer; returns the collective
/// algorithm it ran (-1 for compute ops).
std::int64_t run_backward_op(Communicator& comm, const collectives::CostContext& cost,
                             const Plan& plan, const Op& op, const MoeBwdRef& ref,
                             const ForwardView& fwd, BackwardLayer& bl, const MoeShape& s,
                             std::uint64_t seed, int iteration, int key_rank);

/// The gradient check of one layer of one iteration (identical on every rank).
struct GradCheck {
  int iteration = 0;
  int layer = 0;
  long long compared = 0;  // gradient values compared (dX, dWgate, dW1, dW2; all ranks)
  long long wrong = 0;
  double max_abs_error = 0;
};

/// --check of the layer's gradients (a collective over every rank): per rank dX of its own tokens
/// and dWgate of its own tokens vs reference_backward; per expert the reference contributions of
/// every rank summed over the EP group (and the DP group when the plan all-reduces the expert
/// gradients), compared on the expert's owner. `tol`: |g - ref| <= tol * (1 + |ref|).
GradCheck check_backward_layer(Communicator& comm, const MpiSession& session,
                               const MoeLayerPlan& lp, const BackwardLayer& bl, const MoeShape& s,
                               std::uint64_t seed, int iteration, int key_rank, double tol);

/// A rank's part in the gradient check of a layer it does not run (another pipeline stage's):
/// the same global collectives as check_backward_layer, in the same order, contributing nothing.
GradCheck idle_backward_check(const MpiSession& session, int iteration, int layer);

}  // namespace moesim::exec
