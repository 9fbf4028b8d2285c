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
//
// parallelism.schedule picks the order (docs/model.md, "Pipeline schedules"):
//  - interleaved (vp > 1 model chunks per rank-stage, Megatron-LM's virtual pipeline): the blocks
//    split into pp * vp chunks, rank-stage s holds chunks s, s + pp, ...; a micro-batch runs the
//    chunks in model order, so the last rank-stage sends to rank-stage 0 between chunks;
//  - dualpipe (DeepSeek-V3, section 3.2.1): rank-stage s holds stage s of the forward direction
//    (chunk 0) and stage pp - 1 - s of the reverse one (chunk 1); micro-batches [0, m / 2) enter
//    at rank-stage 0, [m / 2, m) at rank-stage pp - 1; a forward and a backward of the two
//    directions marked `overlap_next` run interleaved (their ops alternate on the compute stream
//    at every collective, each pass's collectives on streams of their own).
// Every schedule runs the same stage plans: only the order and the placement change.

#include <utility>
#include <vector>

#include "core/scenario.hpp"
#include "strategies/plan_builder.hpp"

namespace moesim::strategies {

struct StageAction {
  bool backward = false;
  int micro_batch = 0;
  int chunk = 0;              // the rank-stage's model chunk (interleaved: 0..vp-1; DualPipe: 0, 1)
  bool overlap_next = false;  // DualPipe: runs overlapped with the next action (F&B)
  bool operator==(const StageAction&) const = default;
};

/// The 1F1B order of stage `stage` of `pp` with `micro_batches` micro-batches (above); training
/// false: the forwards only.
std::vector<StageAction> one_f_one_b(int pp, int stage, int micro_batches, bool training);

/// Megatron-LM's interleaved 1F1B order of rank-stage `stage` (training): virtual micro-batch k
/// is micro-batch (k / (pp vp)) pp + k % pp of chunk (k mod pp vp) / pp (backward: vp - 1 minus
/// that); (pp - s - 1) 2 + (vp - 1) pp warm-up forwards (all m vp when m == pp), then one forward
/// and one backward, then the remaining backwards. Needs m a multiple of pp.
std::vector<StageAction> interleaved_one_f_one_b(int pp, int vp, int stage, int micro_batches);

/// DualPipe's order of rank-stage `stage` (DeepSeek-V3's Figure 5; the steps of the reference
/// implementation's step(), with the backward not split into input and weight gradients, so its
/// zero-bubble W chunks run inside B). Needs pp even and m even, m >= 2 pp.
std::vector<StageAction> dualpipe(int pp, int stage, int micro_batches);

/// Model chunks per rank-stage under sc's schedule: 1 (1f1b), vp, or 2 (dualpipe).
int chunks_per_stage(const Scenario& sc);
/// Distinct stage plans (model pieces in model order): pp, or pp * vp (interleaved).
int model_pieces(const Scenario& sc);
/// The blocks of model piece k, [first, end) (1f1b, dualpipe: Scenario::stage_blocks; with
/// parallelism.pipeline_layout, its piece k).
std::pair<int, int> piece_blocks(const Scenario& sc, int k);
/// The model piece that chunk `chunk` of rank-stage `stage` runs.
int piece_of(const Scenario& sc, int stage, int chunk);
/// Whether sc's schedule can run its pp, vp, model.layers and micro-batches (the loader's rules,
/// for callers that change pp: fit_advice); a pipeline_layout must still match them.
bool schedule_applies(const Scenario& sc);
/// Stage `stage`'s order under sc's schedule (inference: the forwards of 1f1b).
std::vector<StageAction> stage_order(const Scenario& sc, int stage);
/// The most chunk forwards whose backward has not run at any point of `order`, an overlapped pair
/// counting its forward before its backward: the activations a rank-stage keeps, in chunks.
int peak_in_flight(const std::vector<StageAction>& order);
/// The same peak with chunk c's forward holding chunk_bytes[c] until its backward (a
/// pipeline_layout's chunks of one rank-stage can hold different blocks).
double peak_in_flight_bytes(const std::vector<StageAction>& order,
                            const std::vector<double>& chunk_bytes);

/// The step's plan from one StagePlan per model piece (stages[k] built on sc.stage_scenario() for
/// piece_blocks(k)): every piece's plan instantiated once per micro-batch on its rank-stage's
/// ranks [s * P / pp, (s + 1) * P / pp), in stage_order, with the stage-to-stage sends; gradient
/// all-reduces (the piece's PlanIndex::gradient_sync) only in the last micro-batch's backward of
/// each copy of the piece (DualPipe holds two).
/// Op labels get "mb{i}." in front when m > 1. The index lists every instance of every MoE layer.
BuiltPlan stitch_stages(const Scenario& sc, const std::vector<StagePlan>& stages);

}  // namespace moesim::strategies
