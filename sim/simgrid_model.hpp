// The `simgrid` network model: the batches of transfers the `flow` model runs, executed by SimGrid
// 3.32 on a platform generated from the Topology, with the same semantics. It is the independent
// reference the flow model is checked against at small and medium scale (docs/design.md §4.1).
// Modes: per_flow (one Comm per transfer, exact per-flow max-min), ptask (one L07 parallel task
// per node pair: faster at scale, one common rate inside a task), auto (per_flow up to
// auto_per_flow_max_gpus GPUs). SimGrid allows one engine per process: later models reuse it.
//
// Semantics, SimGrid configuration, mode trade-offs, time and engine reuse: docs/engines.md,
// section "The simgrid model".
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
  /// Bytes (payload plus per-message overhead bytes, W in docs/engines.md) of the flows finished so
  /// far, per directed link. Flows still moving are not counted.
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
