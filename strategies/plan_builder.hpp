// Builds the Plan of one training (or inference) step from the scenario, this iteration's
// workload and the strategy stack's Decision (docs/design.md §3, docs/strategy-specs.md §1-§4).
// Deterministic.
//
// Rank map (documented contract, shared with exec/): rank = ((d * ep + e) * esp + s) * mp + t for
// DP index d, EP index e, ESP index s, MP index t: MP varies fastest, so MP groups sit inside a
// node when mp <= gpus_per_node. With pipeline stages (parallelism.pp > 1) that is the rank inside
// a stage, and the global rank is stage * (P / pp) + it (stages are blocks of whole nodes).
//
// Pipeline stages and micro-batches (model.micro_batches = m; strategies/stage_schedule.hpp): each
// stage's plan is built once for one micro-batch (forward, then backward) on the stage scenario
// (Scenario::stage_scenario), then instantiated m times on the stage's GPUs in 1F1B order, with
// the activations and their gradients sent between neighbouring stages; the gradients are
// all-reduced once, after the last micro-batch's backward.
#pragma once

#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario.hpp"
#include "strategies/decision.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::strategies {

/// Which ops of the plan belong to what, so results can be summarised per MoE layer and per
/// phase without parsing labels.
struct PlanIndex {
  struct MoeLayerOps {
    int layer = 0;               // MoE layer number (0-based)
    std::vector<OpId> forward;   // every op of the forward MoE layer (gate .. decode)
    std::vector<OpId> backward;  // every op of its backward (training)
    std::vector<OpId> dispatch;  // dispatch all-to-all ops (forward and backward), all chunks
    std::vector<OpId> combine;   // combine all-to-all ops (forward and backward), all chunks
    std::vector<OpId> expert;    // expert FFN compute ops, all chunks
  };
  std::vector<MoeLayerOps> moe_layers;
  std::vector<OpId> gradient_sync;  // allreduce ops of the gradients (training)
};

struct BuiltPlan {
  Plan plan;
  PlanIndex index;
};

/// Blocks one pipeline stage runs, [first_block, end_block) (Scenario::stage_blocks; end_block -1:
/// every block), and whether it holds the token embedding (first stage) and the LM head (last).
struct StagePart {
  int first_block = 0;
  int end_block = -1;
  bool embedding = true;
  bool head = true;
};

/// One stage's plan for one micro-batch on the stage scenario's GPUs: its forward is ops
/// [0, bwd_begin), its backward ops [bwd_begin, end); fwd_out / bwd_out are the last op of each
/// pass (-1 when the pass is empty), what the neighbouring stage waits for.
struct StagePlan {
  BuiltPlan built;
  OpId bwd_begin = 0;
  OpId fwd_out = -1;
  OpId bwd_out = -1;
  /// Backward ops that run once per step, in the last micro-batch only (the optimizer step).
  std::vector<OpId> last_micro_batch_only;
};

/// The groups of `parallelism` under the rank map above (group order = increasing varying index):
///  ep:       fixed (d, s, t), e varies: the all-to-all group (W = ep).
///  esp:      fixed (d, e, t), s varies: the GPUs holding the H/esp slices of the same experts.
///  mp:       fixed (d, e, s), t varies: tensor parallel (contiguous ranks).
///  dp:       fixed (e, s, t), d varies: replicas of the same expert parameters.
///  ep_esp:   fixed (d, t), (e, s) vary (position e * esp + s): Parm's fused all-to-all group.
///  dense_dp: fixed t, everything else varies: replicas of the dense (non-expert) parameters,
///            which every EP/ESP/DP rank holds in full (DeepSpeed-MoE); their gradients are
///            all-reduced over this group, not over `dp`.
///  shard:    the n GPUs of one sharded expert (model.experts_per_gpu = -n): EP positions
///            [x * n, x * n + n) of every EP group; groups of size 1 when experts are not sharded.
struct Groups {
  Grouping ep, esp, mp, dp, ep_esp, dense_dp, shard;
  // layout folded: the context-parallel groups (ranks of one (adp, tp) index); empty otherwise.
  Grouping cp;
};
Groups make_groups(const Scenario& sc);

/// What dC (the per-GPU expert capacity in slots) is rounded up to a multiple of for this decision
/// (docs/model.md, "Capacity"), so that no op of the plan moves a fraction of a token. dC is split
/// into r = pipeline_degree equal chunks c = dC / r, and then
///  - sharded experts (n = expert shards > 1, token repeat factor rho): each of the n / rho GPUs of
///    a hidden-slice group gets rho * c / n slots per (source, expert), so n / rho must divide c;
///  - Parm S1 / S2 / auto with mp > 1: each MP rank takes c / mp slots, so mp must divide c.
/// Hence r * (n / rho) * mp (the factors that apply); r alone for every other plan, which is what
/// dC was always rounded to, so those plans do not change. lcm(r, n / rho) would not do: r = 2,
/// n / rho = 2, dC = 2 gives 1-slot chunks over 2 GPUs. Real systems (Tutel, Parm) pad the same
/// way: the padded slots are empty capacity, never tokens.
int capacity_multiple(const Scenario& sc, const Decision& decision);

/// The attention core of a serving iteration (docs/serving.md, "Iteration price") on one of `mp`
/// ranks holding `rows` tokens: every query attends to its own request's KV cache
/// (model.serving_*). Decode queries under MLA run the absorbed form (FlashMLA: queries and
/// outputs in the kv_lora latent, the cached latent and rope key read as is); prefill chunks the
/// expanded form, as DeepSeek's inference runs them. The core is compute- or HBM-bound
/// (ComputeModel: the larger of its FLOPs and its KV bytes).
struct ServingCore {
  double flops = 0;
  double bytes = 0;
  GemmShape shape{};
};
ServingCore serving_attention_core(const ModelSpec& m, std::int64_t rows, int mp);

/// Builds the step. Throws InputError when the decision cannot apply (pipeline degree larger
/// than the capacity, 2DH on groups that are not node-aligned, a parallel degree that does not
/// divide the shard count) naming the strategy role at fault.
/// `sc` is the whole scenario; with pp > 1 or m > 1 the plan is the stitched 1F1B plan of every
/// stage and micro-batch (the workload then describes one stage: stage_scenario's GPUs).
BuiltPlan build_step_plan(const Scenario& sc, const topology::Topology& topo,
                          const workload::IterationWorkload& work, const Decision& decision);

/// One stage's plan (see StagePlan), on `stage_sc` (a Scenario::stage_scenario).
StagePlan build_stage_plan(const Scenario& stage_sc, const topology::Topology& topo,
                           const workload::IterationWorkload& work, const Decision& decision,
                           StagePart part);

}  // namespace moesim::strategies
