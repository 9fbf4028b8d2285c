// The `simgrid` network model: the same batches of transfers the `flow` model runs, executed by
// SimGrid 3.32 on a platform generated from our Topology. It is the independent, well-validated
// reference the flow model is checked against at small and medium scale (DESIGN.md 4.1).
//
// Semantics (identical to the flow model, checked by tests/sim/simgrid_model_test.cpp):
//   - every Transfer (src != dst) is one flow along topology.route(src, dst) over directed links;
//     each directed link is its own SimGrid link, so opposite directions never share;
//   - a flow first waits L = sum of its route's link latencies + params.message_latency_s, then
//     moves W = bytes + params.message_overhead_s * B_inj (B_inj: bandwidth of the route's first
//     link) at the max-min fair rate among the flows moving at that time;
//   - a zero-byte transfer only waits L; a transfer with src == dst is local (no network) and
//     completes at once;
//   - a batch completes when its last flow finishes (an empty batch at the time it starts).
//
// SimGrid is configured as the plain fluid max-min model: network/model:CM02,
// network/crosstraffic:0, network/TCP-gamma:0 (no window bound), latency and bandwidth factors 1,
// weight-S 0, and surf/precision 1e-9 s (the default, 1e-5 s, ends flows and latency phases up
// to 10 us early). One difference remains that no setting removes: CM02 gives each flow a sharing
// penalty equal to its route latency (TCP's RTT unfairness: at a shared bottleneck, rates are
// inversely proportional to latency), not plain max-min. So in per_flow mode routes report zero
// latency to SimGrid and the model itself holds each flow for its L before starting its Comm
// ("wait L, then transfer", exactly). In ptask mode SimGrid's L07 model pays the latency natively:
// it has no RTT weighting, and a task waits the largest L of its flows before any of them moves.
//
// Two ways to express the traffic, chosen at construction (the SimGrid host model must be fixed
// before the platform is built):
//   - per_flow: one SimGrid Comm per transfer: exact per-flow max-min. Cost grows faster than
//     linearly with the flows in flight (16k flows: ~5-10 s on a loaded 2-core machine).
//   - ptask: one parallel task (host/model:ptask_L07) per (source node, destination node) pair of
//     a batch, carrying the byte matrix of that pair's transfers. Much faster at scale. L07 shares
//     links with SimGrid's fair-bottleneck solver: tasks get equal byte shares of a saturated
//     link, so one-flow tasks behave exactly like per-flow max-min. It differs from per-flow
//     sharing inside a task: all flows of one task progress at one common rate (they end
//     together; a task's bandwidth on a link is split in proportion to its flows' sizes, where
//     per-flow max-min splits equally and lets short flows finish first), and the task waits the
//     largest latency of its flows. On symmetric traffic (a linear all-to-all of equal sizes)
//     both give the same time when every flow of a task sees the same bottleneck (one switch:
//     0.0000% at 1,024 GPUs). On skewed traffic (unequal sizes within a node pair) ptask slows the
//     small flows of a pair and can shift time between batches (see the tests and the --skew
//     benchmark). With ECMP in a fat tree, a task is held back by the most loaded of its flows'
//     paths where per-flow max-min lets the others finish: measured +9.4% on a 128-GPU uniform
//     all-to-all, and many more distinct completion events, each a full L07 solve (slow above a
//     few hundred GPUs). Use per_flow for fidelity on multi-path fabrics.
//   - auto: per_flow when the topology has at most `auto_per_flow_max_gpus` GPUs, ptask above.
//
// Time: next_completion_time() asks SimGrid's models for their next event without advancing
// (Model::next_occurring_event, idempotent in 3.32). Flows inside a batch end, and latency phases
// end, at times when no batch completes; SimGrid cannot look past them without simulating them,
// so next_completion_time() returns the next SimGrid event, which is a lower bound on the next
// batch completion: advance_to() to such a time returns an empty list. Completions are then
// reported at exactly the time advance_to() was given.
//
// One SimgridModel per process: SimGrid 3.32 allows one Engine per process and no re-creation
// after it is destroyed. Constructing a second SimgridModel in the same process throws
// RuntimeError (run comparisons in separate processes, as the tests do).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "sim/network_model.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::sim {

enum class SimgridMode { kPerFlow, kPtask, kAuto };
std::string_view simgrid_mode_name(SimgridMode m);  // "per_flow" | "ptask" | "auto"
/// Parses "per_flow" | "ptask" | "auto"; throws InputError naming the accepted values.
SimgridMode parse_simgrid_mode(std::string_view text);

/// The mode kAuto resolves to on a topology of `gpus` GPUs (what SimgridModel::mode() reports),
/// available without SimGrid so that the CLI can say which mode a run uses.
inline SimgridMode resolve_simgrid_mode(SimgridMode m, int gpus, int auto_per_flow_max_gpus = 64) {
  if (m != SimgridMode::kAuto) return m;
  return gpus <= auto_per_flow_max_gpus ? SimgridMode::kPerFlow : SimgridMode::kPtask;
}
inline std::string_view resolved_simgrid_mode_name(SimgridMode m) {
  return m == SimgridMode::kPerFlow ? "per_flow" : m == SimgridMode::kPtask ? "ptask" : "auto";
}

struct SimgridOptions {
  SimgridMode mode = SimgridMode::kAuto;
  /// kAuto picks per_flow up to this many GPUs (a full all-to-all is then <= 64^2 = 4k flows,
  /// about a second), ptask above.
  int auto_per_flow_max_gpus = 64;
};

class SimgridModel final : public NetworkModel {
 public:
  /// Builds the SimGrid engine and platform for `topo` (which must outlive the model), or, when
  /// this process built them already, runs on them from the engine's current clock as time zero:
  /// SimGrid 3.32 allows one engine per process. Reuse needs the same Topology object (and links),
  /// mode and message latency, and no other SimgridModel alive; otherwise throws RuntimeError.
  SimgridModel(const topology::Topology& topo, NetworkParams params, SimgridOptions options = {});
  ~SimgridModel() override;
  SimgridModel(const SimgridModel&) = delete;
  SimgridModel& operator=(const SimgridModel&) = delete;

  std::string_view name() const override { return "simgrid"; }
  BatchId start_batch(double now_s, const std::vector<Transfer>& transfers,
                      int priority = 0) override;
  double next_completion_time() override;
  std::vector<BatchCompletion> advance_to(double t) override;
  /// Bytes (payload plus per-message overhead bytes, W above) of the flows finished so far, per
  /// directed link. Flows still moving are not counted.
  std::vector<double> link_bytes() const override;

  /// The mode in use (never kAuto).
  SimgridMode mode() const;
  /// Current simulated time of the model, seconds.
  double now() const;
  /// SimGrid activities (Comms or parallel tasks) started so far.
  std::int64_t num_activities_started() const;

  /// True once this process has created a SimGrid engine (later models must reuse its platform).
  static bool engine_created();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim::sim
