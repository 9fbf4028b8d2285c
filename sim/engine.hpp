// The discrete-event engine (docs/design.md §4.1): runs a Plan in simulated time on a topology and
// returns a RunResult (core/run_result.hpp).
//
// Semantics (core/plan.hpp has the dependency rules):
//  - Ops on one (rank, stream) run in plan order; different streams run concurrently. An op
//    instance (op, rank) starts when it is the first unfinished op of its (rank, stream) and its
//    deps on that rank are done.
//  - Compute ops take ComputeModel::duration(spec, rank_scale[pos]). While a collective is active
//    on the same rank, running compute progresses at 1 / (1 + interference) of its speed (the
//    rate changes exactly when communication starts or ends on that rank).
//  - Copy ops take ComputeModel::copy_duration(bytes).
//  - A collective runs per group of its grouping. Choice documented here: a group's collective
//    starts when ALL its member ranks have it ready (deps done and its stream free there), as an
//    NCCL collective cannot make progress until every member has launched it; ranks that are
//    ready earlier wait with their stream blocked, and their recorded start is the group start.
//    The algorithm (select_algorithm resolves auto per group) is lowered into phases that run in
//    sequence: kCopy / kReduce phases take local_bytes / HBM bandwidth; kTransfers phases go to
//    the NetworkModel as one batch (their self-copy local_bytes run concurrently, the phase ends
//    when both are done); Phase::repeat runs the phase that many times. The collective completes
//    on all the group's ranks when its last phase completes. While it is active it counts as
//    communication on every member rank (interference, exposed communication).
//  - Groups of one collective that become ready at the same instant are submitted together when
//    EngineConfig::merge_ready_groups is set (default): their phases run in lockstep, each phase
//    one network batch for all of them. This keeps a 512-group EP all-to-all at 4 batches instead
//    of 2,048; the price is that a group whose phase finishes early waits for the slowest group
//    of its cohort before its next phase (nothing changes for symmetric collectives).
//  - Op::partition_size > 0 splits a collective into ceil(bytes / partition_size) equal chunks
//    run back to back (micro-ops, Lina); each chunk is a separate batch, so the network model can
//    interleave other batches (with its priority) between them.
//  - Priority gate (Lina's per-GPU communication scheduler; active only when some op has
//    priority < 0): an op instance with priority > 0 reserves its rank from the moment it is
//    ready (deps done, head of its stream) until it finishes; an op with priority < 0 (a
//    yielding all-reduce micro-op) starts on a rank only while no reservation is held there. A
//    started op is never preempted. Compute ops may carry priority > 0 to reserve the network
//    ahead of the all-to-all they feed ("no all-reduce launch once backward combine starts").
//  - network == analytical: no lowering; each group's collective takes the closed-form
//    select_algorithm(...).analytical_time(...); groups that span nodes first wait for their
//    members' NICs (analytical_nic_sharing below; sim/analytical_model).
//
// Scale: per-rank state lives in flat arrays indexed by (op offset + position in Op::ranks); ops
// with a RankSet are walked per rank without copying the op; the event queue (sim/event_queue.hpp)
// pops in (time, push order), so equal-time events run in a deterministic order.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "core/cluster_spec.hpp"
#include "core/plan.hpp"
#include "core/run_result.hpp"
#include "sim/compute_model.hpp"
#include "sim/flow_model.hpp"
#include "sim/network_model.hpp"
#include "sim/simgrid_model.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::sim {

enum class NetworkKind { kAnalytical, kFlow, kSimgrid };
std::string_view network_kind_name(NetworkKind k);
std::optional<NetworkKind> parse_network_kind(std::string_view s);

struct EngineConfig {
  NetworkKind network = NetworkKind::kFlow;
  NetworkParams net;
  ComputeParams compute;
  Dtype precision = Dtype::kFp16;
  /// Ranks a Chrome trace of this run shows at most (sim/trace.hpp picks the sample).
  int trace_max_ranks = 64;
  /// Submit groups of one collective that become ready together as one cohort (see above).
  bool merge_ready_groups = true;
  /// network == analytical: a collective whose group spans nodes holds its members' NICs, one
  /// collective per NIC at a time in the order they start (docs/ARCHITECTURE.md, "Concurrent
  /// collectives on the analytical engine"); false: each runs as if alone (closed-form tests).
  bool analytical_nic_sharing = true;
  /// FlowModelOptions::event_tolerance of the flow model (scenario engine.flow.event_tolerance).
  double flow_event_tolerance = 1e-9;
  /// FlowModelOptions::sharing (scenario engine.flow.sharing; the library default is per-flow).
  FlowSharing flow_sharing = FlowSharing::kPerFlow;
  /// SimgridOptions::mode (scenario engine.simgrid.mode).
  SimgridMode simgrid_mode = SimgridMode::kAuto;
};

/// Creates the network model for `kind`: AnalyticalModel (batch-level, no sharing),
/// FlowModel, or SimgridModel (only when built with SimGrid; InputError otherwise).
/// flow_event_tolerance: FlowModelOptions::event_tolerance (ignored by the other models).
std::unique_ptr<NetworkModel> make_network_model(NetworkKind kind, const topology::Topology& topo,
                                                 const NetworkParams& params,
                                                 double flow_event_tolerance = 1e-9,
                                                 FlowSharing flow_sharing = FlowSharing::kPerFlow,
                                                 SimgridMode simgrid_mode = SimgridMode::kAuto);

/// Runs plan on topo. network == analytical uses closed-form collective times; flow and simgrid
/// lower collectives into batches for the model make_network_model creates. Validates the plan
/// (InputError) and throws RuntimeError if it deadlocks (an op whose group never assembles).
RunResult run_plan(const Plan& plan, const topology::Topology& topo, const EngineConfig& config);

/// The same with a caller-provided network model, used for every collective whatever
/// config.network says (tests with fake models, custom models). The model must be fresh.
RunResult run_plan(const Plan& plan, const topology::Topology& topo, const EngineConfig& config,
                   NetworkModel& network);

}  // namespace moesim::sim
