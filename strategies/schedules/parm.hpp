// Parm's dedicated schedules for MP+EP+ESP MoE layers (docs/strategy-specs.md §5;
// docs/schedules.md).
//
//  parm_baseline  DeepSpeed-MoE: the plan builder's own ESP path (ESP all-gather, EP all-to-all,
//                 expert duplicated over MP, ESP all-reduce, EP all-to-all).
//  parm_s1        MP-Split before the gate; gate, encode and decode on S / mp tokens; the fused
//                 EP&ESP all-to-all (local dump before, local combine after) of y / mp bytes;
//                 MP all-gather of the layer output (S * M) at the end.
//  parm_s2        Gate on all S tokens, MP-Split after the gate; fused all-to-all of y / mp; the
//                 return all-to-all and the MP all-gather of its result run together as one SAA
//                 collective (strategies/collectives/saa.cpp); local combine and decode on S.
//  parm_auto      Parm Alg. 1 on closed-form alpha-beta times of the topology (parm_choose).
// Backward mirrors forward: the backward of MP-Split is an MP all-gather (S1: of the gate's input
// gradient, S * M; S2: of the dispatch-backward result, again inside an SAA), the backward of the
// MP all-gather is a split (free), the local dump's backward is the local combine and vice versa.
// Because MP ranks now train their experts on different tokens, the expert gradients are also
// all-reduced over the MP group (before the builder's DP all-reduce).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario.hpp"
#include "strategies/plan_builder.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::strategies::schedules {

/// parm_baseline, parm_s1, parm_s2, parm_auto.
bool is_parm(ScheduleRole r);
/// parm_s1, parm_s2, parm_auto: the schedules this file builds (the baseline is the builder's).
bool is_fused_parm(ScheduleRole r);

/// Why no Parm schedule applies to the scenario ("" when one does): needs mp >= 2 or esp >= 2,
/// unsharded experts (experts_per_gpu >= 1) and token repeat factor 1.
std::string parm_inapplicable_reason(const Scenario& sc, int parallel_degree);

/// Parm Alg. 1 (docs/strategy-specs.md §5) for per-GPU expert capacity dC = `capacity` slots:
/// x = B*L*M*b, y = E*dC*M*esp*b; t_S1 = 2 t_A2A(y/mp) + t_AG(x), t_S2 = t_A2A(y/mp) + t_SAA(y/mp),
/// every t the collective library's closed form (alpha + beta * n on this topology, the same value
/// the analytical engine charges) on the groups of rank 0; both doubled for the backward, and
/// (ours) t_S2 plus the extra gate / encode / decode / local-combine time of running them on S
/// tokens instead of S / mp (CostModel roofline GEMM, HBM-bound kernels).
struct ParmChoice {
  double t_s1_s = 0;
  double t_s2_s = 0;
  ScheduleRole choice = ScheduleRole::kParmS1;  // S1 when t_S1 <= t_S2
};
ParmChoice parm_choose(const Scenario& sc, const topology::Topology& topo, std::int64_t capacity);

/// The SAA grouping "ep_esp_mp": per DP index all its ranks in rank order, so an all_to_all with
/// algo saa and sub_group = mp runs the ep_esp all-to-all and the MP all-gather together.
/// Disjoint layout: (e, s, t) at position (e*esp + s)*mp + t, the all-to-all over the positions
/// of one t. Overlapped layout: the ep_esp group itself (MP groups are its blocks of mp), the
/// all-to-all over all its positions (saa_a2a_spans_group).
Grouping saa_grouping(const Scenario& sc);

/// What a schedule needs from the plan builder to emit one MoE layer (filled by plan_builder.cpp).
struct MoeLayerBuild {
  const Scenario* sc = nullptr;
  const topology::Topology* topo = nullptr;
  Plan* plan = nullptr;
  std::function<GroupingId(const Grouping&)> grouping;  // find-or-add by name
  const Groups* groups = nullptr;
  StreamId compute = 0, comm = 0, comm_out = 0, grad = 0;
  int layer = 0;  // block index (labels "L{layer}.fwd...")
  int W = 1, esp = 1, mp = 1, dp = 1;
  std::int64_t S = 0, M = 0, H = 0, E = 0, dE = 1, k = 1, b = 2;
  CollectiveAlgo a2a = CollectiveAlgo::kLinear;
  LayoutRole layout = LayoutRole::kPlain;
  std::vector<std::int64_t> chunks;  // dC split into the pipeline chunks
  PlanIndex::MoeLayerOps* ops = nullptr;
  std::vector<OpId>* gradient_sync = nullptr;
};

/// Emits the forward MoE layer under S1 or S2 (auto resolved by parm_choose); returns its last op.
OpId parm_forward(const MoeLayerBuild& b, ScheduleRole schedule, OpId prev);

struct ParmBackward {
  OpId out = -1;         // last op of the layer's backward
  OpId grad_ready = -1;  // after which the expert gradients may be all-reduced over DP
};
/// Emits the backward MoE layer (mirror of parm_forward).
ParmBackward parm_backward(const MoeLayerBuild& b, ScheduleRole schedule, OpId prev);

}  // namespace moesim::strategies::schedules
