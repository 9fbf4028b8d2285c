// The plan executor of the real backend (docs/design.md §4.2), host path. Every rank builds the
// same Plan (strategies::run_stack is deterministic) and calls Executor::run with it; the executor
// walks the ops in plan order (op ids are a topological order, so every dep is done before its op,
// and every rank meets the collectives in the same order, which rules out cross-matching and
// deadlock) and runs the ops that include this rank:
//  - collectives through the Communicator: all_to_all / all_to_allv / send_recv as the phases the
//    collective library lowers (linear = one grouped exchange, 2DH = stride copies + intra and
//    inter phases, see phase_runner.hpp); all_reduce / all_gather / reduce_scatter as the
//    communicator's group collectives;
//  - the MoE layer on real seeded data: the layer program (exec/layer_program.hpp) run by
//    HostLayerOps (exec/host_layer.hpp, the CPU kernels): gate (+top-k, capacity), encode, per
//    chunk dispatch -> expert fc1 (GEMM + ReLU) -> fc2 -> combine, decode; and its backward from
//    a seeded dY (decode / combine / fc2 / fc1 / dispatch / encode / gate backward, the DP
//    all-reduce of the real expert gradients) on the plain, plan-routed, deepep, sharded and
//    Parm layouts; --check compares dX, dWgate, dW1 and dW2 with the reference
//    (exec/grad_check.hpp);
//  - every other op (attention, dense FFN, shared experts, other backward, gradient buckets) with
//    scratch buffers of the plan's sizes: collectives move real bytes, compute ops outside the
//    MoE forward are timed as empty ops on the host path (their cost is what the simulator's
//    compute model is for; the GPU path runs them as cuBLAS GEMMs).
// Streams are serialised on the host path (an in-order walk honours every dep and stream order);
// the measured per-op times are gathered to every rank so each rank's strategy stack sees the same
// RunResult and takes the same next decision.
//
// GPU path (the communicator is an NcclCommunicator; exec/cuda_executor.hpp): the same ops on
// device buffers in the scenario's dtype, one CUDA stream per plan stream, deps across streams as
// CUDA events, the CUDA kernels and cuBLAS for the MoE forward, NCCL for the collectives, op
// times from CUDA event pairs read after the step's final synchronize; ops are issued in
// priority_issue_order() (Lina). The timing gather and the RunResult are shared with the host path.
//
// The plain MoE data path runs unsharded experts with esp = 1. Sharded experts (experts_per_gpu
// < 0: P1 / P2 / rho) run on the host path through exec/sharded_path.hpp; plans with esp > 1 or
// Parm's fused MP schedules run their MoE layers through exec/parm_path.hpp; layers whose
// dispatch is a routed all_to_allv (Decision::variable_dispatch: routing strategies, dropless,
// inference placement) take their layout from exec/routed_path.hpp. All four run the same layer
// program; they differ in the LayerLayout they build from the plan and load on the host. The GPU
// path runs the same layers (ProgramLayerRef: uploaded before the step, outputs downloaded into
// the same buffers after). Plans no data path covers run with scratch buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/run_result.hpp"
#include "core/scenario.hpp"
#include "exec/communicator.hpp"
#include "exec/grad_check.hpp"
#include "exec/moe_data.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/runner.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::exec {

class MpiSession;

struct ExecOptions {
  bool check = false;  // compare every MoE layer with the single-process reference
  /// Relative tolerance of the check: |y - ref| <= tol * (1 + |ref|) (fp32 kernels against a
  /// double-accumulating reference). The GPU path runs the scenario's dtype and uses
  /// max(tolerance, check_tolerance(dtype)) (exec/moe_data.hpp).
  double tolerance = 1e-4;
};

/// One MoE layer of the plan as the data path runs it (host and GPU path). Chunk j covers
/// capacity slots [offset[j], offset[j] + caps[j]) of every expert.
struct MoeLayerPlan {
  int moe = 0;  // MoE layer number
  std::vector<int> caps, offset;
  int capacity = 0;
  bool has_a2a = false;  // dispatch / combine all-to-alls (false: W = 1, experts local)
  // The EP layout the plan was built with (from its dispatch all-to-all's grouping, not from the
  // scenario: Lina's expert packing builds the plan on fewer, fuller EP ranks): W ranks per EP
  // group, dE = E / W experts on each, this rank at position ep_pos (experts ep_pos * dE + le).
  int ep = 1, local_experts = 0, ep_pos = 0;
  int block = -1;       // the plan's block of this layer (labels L{block}.fwd.*)
  bool routed = false;  // dispatch is a routed all_to_allv (exec/routed_path.hpp)
  // This rank runs the layer: with pipeline stages (parallelism.pp) a rank runs its stage's
  // layers only, and takes no part in the others' data path or check.
  bool on_rank = false;
};

/// The layer program's record (exec/layer_program.hpp) of a plain layer: capacity routing, dE
/// whole experts per EP position. The host path and the GPU path both run it.
struct LayerLayout;
LayerLayout layer_layout(const MoeLayerPlan& p, const MoeShape& s);

/// What a forward MoE op of the plan does, read from its role (Op::role, set by the plan builder;
/// no label is parsed).
struct MoeOpRef {
  // One of the plain, routed and sharded paths' steps (kGate ... kPartialSum of OpRoleKind;
  // kParamGather and kPartialSum only with sharded experts, exec/sharded_path.hpp), else kNone:
  // the plan's own kinds, not a second enum to map them into.
  OpRoleKind kind = OpRoleKind::kNone;
  int block = -1;
  int chunk = -1;  // 0-based
};
MoeOpRef moe_op_ref(const Op& op);
/// What the GPU path stores as a collective's resolved algorithm where NCCL runs its own
/// (ncclAllReduce / ncclAllGather / ncclReduceScatter): the record then says "nccl"
/// (CollectiveRecord::library_algo), not moesim's choice for the same call.
inline constexpr std::int64_t kLibraryAlgo = -2;
/// The MoE layers of `plan` as rank `rank` runs them (chunk capacities from the expert fc1 GEMMs:
/// c_j = m * batch / (W * dE) = m * batch / E in both the plain and the flexible layout when
/// esp = rho = n = 1, docs/model.md; the EP layout from the dispatch all-to-all's grouping).
std::vector<MoeLayerPlan> plan_moe_layers(const Plan& plan, int rank, int experts);

/// The GPU path's issue order: a topological order of the plan in which, among the ops whose deps
/// are all issued, the highest Op::priority goes first, then the lowest id (Lina: the all-to-alls
/// before gradient micro-ops; plain plans keep id order). It depends on the plan alone, so every
/// rank issues its collectives in the same order (NCCL's requirement).
std::vector<OpId> priority_issue_order(const Plan& plan);

/// Buffer sizes of this rank's part (position `pos` in a group of `group_size`) of an all_to_all,
/// all_to_allv or send_recv outside the MoE data path, shared by the host and GPU path.
/// all_to_allv: the matrix's row and column sums. Otherwise the plan's bytes rounded up to whole
/// 4-byte elements in each of the W chunks, so no lowered offset is fractional (SAA also cuts a
/// chunk into n <= 8 slices: a multiple of lcm(1..8) = 840 elements), and SAA receives the
/// all-to-all all-gathered over its sub-group: sub_group times that.
struct ExchangeSizes {
  std::size_t send = 0, recv = 0;
};
ExchangeSizes exchange_sizes(const CollectiveSpec& spec, const ByteMatrix* matrix,
                             std::size_t group_size, int pos);

class DevicePath;
class ShardedPath;
class ParmPath;

/// Result of checking one MoE layer of one iteration (identical on every rank).
struct LayerCheck {
  int iteration = 0;
  int layer = 0;                   // MoE layer number
  long long compared = 0;          // output elements compared (all ranks)
  long long wrong = 0;             // elements outside tolerance
  long long dropped = 0;           // choices the executor's gate dropped (all ranks)
  long long expected_dropped = 0;  // choices the reference's capacity rule drops
  double max_abs_error = 0;
};

class Executor {
 public:
  Executor(const Scenario& sc, const topology::Topology& topo, MpiSession& session,
           Communicator& comm, ExecOptions options = {});
  ~Executor();

  /// Runs this rank's part of `plan` (a collective call: every rank must call it with the same
  /// plan) and returns the measured RunResult, identical on every rank.
  RunResult run(const Plan& plan);
  /// run() as a strategies::Backend (for run_stack).
  strategies::Backend backend();

  /// This rank's output (S x M fp32) of every MoE layer of the last run; empty without data path.
  const std::vector<std::vector<float>>& last_outputs() const { return outputs_; }
  /// This rank's gradients of every MoE layer whose backward the layer program ran in the last
  /// run, each [dX (S x M) | dWgate (M x E) | dW1 of its local experts | dW2 of them] (dW after
  /// the plan's DP all-reduce); empty entries for the other layers.
  const std::vector<std::vector<float>>& last_gradients() const { return gradients_; }
  /// Choices dropped by the capacity rule on this rank, per MoE layer of the last run.
  const std::vector<long long>& last_dropped() const { return dropped_; }
  /// Every layer check so far (options.check).
  const std::vector<LayerCheck>& checks() const { return checks_; }
  /// Every gradient check so far (options.check; layers whose backward the program ran): empty
  /// for sharded / Parm / deepep layers.
  const std::vector<GradCheck>& grad_checks() const { return grad_checks_; }
  /// Elements outside tolerance over every layer check and gradient check so far.
  long long total_wrong() const;
  /// Whether the last run's MoE forward ran on real data (plain, sharded or Parm path; plans no
  /// data path covers run on scratch buffers, see exec/sharded_path.hpp, exec/parm_path.hpp).
  bool has_data_path() const;
  /// Whether the last run's MoE backward ran on real data (the layer program's backward steps,
  /// is_backward_step, ran for real).
  bool has_backward_path() const { return real_backward_; }
  const MoeShape& shape() const { return shape_; }
  int runs() const { return iteration_; }
  /// True when ops run on the GPU (NCCL communicator); false on the host path.
  bool on_device() const { return device_ != nullptr; }

 private:
  struct Layer;
  void prepare_layers(const Plan& plan);
  std::vector<double> run_ops(const Plan& plan);
  void collect_layer_results();
  RunResult gather_result(const Plan& plan, const std::vector<double>& all) const;
  void run_op(const Plan& plan, const Op& op);
  void run_collective(const Plan& plan, const Op& op);
  void enable_backward(const Plan& plan, Layer& L);
  void check_layers();

  const Scenario& sc_;
  const topology::Topology& topo_;
  // `auto` algorithms are chosen with the scenario's message costs and calibration, as in the
  // simulator (strategies::scenario_cost_context), so exec runs what the simulation predicts.
  collectives::CostContext cost_;
  MpiSession& session_;
  Communicator& comm_;
  ExecOptions options_;
  MoeShape shape_;
  bool data_path_ = false;
  int iteration_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<float>> outputs_;
  std::vector<std::vector<float>> gradients_;
  std::vector<long long> dropped_;
  std::vector<LayerCheck> checks_;
  std::vector<GradCheck> grad_checks_;
  std::vector<std::int64_t> collective_algo_;  // per op of the current plan: resolved algo
  std::unique_ptr<DevicePath> device_;         // the GPU path, or null (host path)
  std::unique_ptr<ShardedPath> sharded_;       // host data path of sharded experts, or null
  std::unique_ptr<ParmPath> parm_;  // this plan's MP / ESP MoE layers (exec/parm_path.hpp), or null
  std::vector<std::pair<int, int>> checked_;  // per MoE layer of the last run: (moe, capacity)
  bool real_data_ = false;                    // the last run's MoE forward ran on real data
  bool real_backward_ = false;                // ... and its plain layers' backward too
  double tolerance_ = 0;                      // of the check, for this path's dtype
};

}  // namespace moesim::exec
