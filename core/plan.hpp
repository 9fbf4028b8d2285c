// The Plan IR (docs/design.md §3): a DAG of operations for one iteration, built once by the
// strategy code (strategies/plan_builder) and run unchanged by either backend: sim::run (simulated
// time) or exec::run (CUDA/NCCL or the MPI host path).
//
// Compactness at 4,096 GPUs: a collective is one Op over all its groups (not P^2 transfers);
// identical per-rank ops are one Op with a RankSet; per-rank differences in compute (skewed expert
// load) are a per-rank scale vector, not P ops.
//
// Dependency semantics (per rank): op B depending on op A means that on every rank r in both
// B.ranks and A.ranks, B(r) starts after A(r) has finished. A collective starts on a rank when its
// deps on that rank are done and its stream there is free; data moves between two ranks once both
// have started. Every dep must share at least one rank with the op (validated).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/units.hpp"

namespace moesim {

using OpId = std::int32_t;
using StreamId = std::int16_t;

/// A set of ranks: an arithmetic range {first, first+stride, ...} (count items) or an explicit
/// sorted list. Ranges keep "all 4,096 ranks" at 12 bytes.
class RankSet {
 public:
  RankSet() = default;
  static RankSet range(int first, int count, int stride = 1);
  static RankSet list(std::vector<int> ranks);  // sorted and deduplicated on construction
  static RankSet all(int num_ranks) { return range(0, num_ranks, 1); }

  int size() const { return list_.empty() ? count_ : static_cast<int>(list_.size()); }
  int at(int i) const { return list_.empty() ? first_ + i * stride_ : list_[i]; }
  bool contains(int rank) const;
  /// Position of rank in the set, or -1.
  int index_of(int rank) const;
  /// The same set with every rank plus `offset` (a pipeline stage's ops moved to its GPUs).
  RankSet shifted(int offset) const;
  bool operator==(const RankSet& o) const;

 private:
  int first_ = 0, count_ = 0, stride_ = 1;
  std::vector<int> list_;
};

/// Partition of ranks into the groups a collective runs over (every EP group, every DP group...).
/// All groups of one Grouping have the same size; ranks within a group are in group order
/// (position i = "group rank" i, which is what per-pair byte matrices are indexed by).
struct Grouping {
  std::string name;  // "ep", "dp", "mp", "esp", "ep_esp", "world", ...
  std::vector<std::vector<int>> groups;
  int group_size() const { return groups.empty() ? 0 : static_cast<int>(groups[0].size()); }
};
using GroupingId = std::int32_t;

enum class OpKind { kCompute, kCollective, kCopy };
// kNorm: layer norms, activations, rotary (memory-bound elementwise kernels of a block);
// kOptimizer: the optimizer step over a rank's parameters. docs/model.md lists which op has which.
enum class ComputeClass {
  kGemm,
  kGate,
  kEncode,
  kDecode,
  kElementwise,
  kAttention,
  kOther,
  kNorm,
  kOptimizer
};
enum class CollectiveType {
  kAllToAll,
  kAllToAllv,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kSendRecv
};
enum class CollectiveAlgo {
  kAuto,
  kLinear,
  k2dh,
  kRing,
  kTree,
  kHierarchical,
  kSaa,
  k3dh,
  kDeepep
};

std::string_view op_kind_name(OpKind k);
std::string_view compute_class_name(ComputeClass c);
std::string_view collective_type_name(CollectiveType t);
std::string_view collective_algo_name(CollectiveAlgo a);
std::optional<CollectiveType> parse_collective_type(std::string_view s);
std::optional<CollectiveAlgo> parse_collective_algo(std::string_view s);

/// GEMM shape as the compute model sees it: `batch` independent (m x k) * (k x n) products.
/// The plain MoE layout runs W small matrices (batch = W, small m); the flexible layout one large.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  /// Distinct weight (B) matrices among the batch items; 0 = one per item. The plain layout's
  /// W x dE items share dE experts' weights, which is what lets the L2 cache serve re-reads.
  std::int64_t weights = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k * batch; }
};

struct ComputeSpec {
  ComputeClass cls = ComputeClass::kOther;
  Flops flops{0};                 // per rank (before rank_scale)
  Bytes bytes{0};                 // memory traffic per rank (before rank_scale)
  std::optional<GemmShape> gemm;  // for kGemm: the shape decides efficiency
  /// The GEMM runs on the fp8 tensor cores (model.precision.gemm: fp8) at the GPU's fp8 peak.
  bool fp8 = false;
  /// fp8 GEMMs: HBM traffic of the quantization kernels that feed this one (casts of its input
  /// and, in backward, of the output gradient; docs/model.md "Precision"). They run before it on
  /// its stream, so their time adds to the GEMM's (per rank, before rank_scale).
  Bytes cast_bytes{0};
  /// A forward kernel replayed in backward (model.recompute), for breakdowns.
  bool recompute = false;
  /// A backward kernel (input and weight gradients): the attention core's backward runs at its
  /// own efficiency (FlashAttention recomputes the scores).
  bool backward = false;
  /// Optional per-rank multiplier (indexed by position in Op::ranks) for skewed load.
  std::shared_ptr<const std::vector<float>> rank_scale;
};

/// Per-pair bytes of an all_to_allv, indexed by group positions (src, dst). Stored as token (or
/// element) counts times a unit, so a 4,096^2 dense matrix is 64 MiB of uint32, and sparse
/// patterns (CSR) cost only their non-zeros. The same matrix applies to every group of the op
/// unless per_group has one per group.
struct ByteMatrix {
  int size = 0;   // W
  Bytes unit{1};  // bytes per count
  bool dense = true;
  std::vector<std::uint32_t> counts;      // dense: W*W row-major (row = source)
  std::vector<std::int64_t> row_offsets;  // sparse CSR: W+1 offsets
  std::vector<std::int32_t> cols;         // sparse CSR: destination positions
  std::vector<std::uint32_t> values;      // sparse CSR: counts
  Bytes at(int src, int dst) const;
  Bytes row_sum(int src) const;
  Bytes col_sum(int dst) const;
  Bytes total() const;
};

/// Which experts the tokens of a routed MoE dispatch all_to_allv are for (Decision::
/// variable_dispatch; one EP group). The matrix only says how many tokens each pair moves; the
/// real backend (exec/routed_path.hpp) must also run every token through the right expert, so the
/// plan builder attaches this; the simulator does not read it.
///  counts[a * experts + e]: tokens group position a routes to expert e (after drops).
///  Destinations, per source a, experts in ascending order: spread = false: e's tokens split over
///  the positions holding e (replicas[e], ascending; or {e / experts_per_gpu} when replicas is
///  empty), c / r each and the c % r left over one more each starting at replica a mod r
///  (inference::token_matrix); spread = true (the "ideal" inference placement, every GPU
///  computes every expert): the row's tokens in expert order dealt as consecutive runs to
///  positions (a + y) mod W, y = 0..W-1, row / W each (+1 for y < row % W).
struct ExpertRouting {
  int size = 0;     // W
  int experts = 0;  // E
  std::vector<std::uint32_t> counts;
  int experts_per_gpu = 1;
  std::vector<std::vector<int>> replicas;
  bool spread = false;
};

/// What a token-deduplicating (DeepEP-style) dispatch of one EP group moves: a token goes once
/// to every node that holds one of its experts, and on that node once to every GPU that does,
/// however many of its k experts sit there. Counted on the sampled tokens (workload::
/// LayerDispatch::distinct). The group is node-aligned: position q = node q / m, local q % m,
/// m = size / nodes.
///  gpu_tokens[s * size + q]: tokens of position s with at least one expert on position q;
///  node_tokens[s * nodes + b]: tokens of position s with at least one expert on node b.
struct NodeDedup {
  int size = 0;   // W
  int nodes = 0;  // N
  Bytes unit{1};  // bytes per token
  std::vector<std::uint32_t> gpu_tokens;
  std::vector<std::uint32_t> node_tokens;
};

struct CollectiveSpec {
  CollectiveType type = CollectiveType::kAllToAll;
  CollectiveAlgo algo = CollectiveAlgo::kAuto;
  GroupingId grouping = 0;
  /// all_to_all: bytes each rank sends in total (S; S/W to each peer incl. itself);
  /// all_reduce / reduce_scatter: buffer size per rank; all_gather: output size per rank;
  /// send_recv: bytes per message.
  Bytes bytes{0};
  /// all_to_allv: one matrix for every group, or per_group[g] for group g.
  std::shared_ptr<const ByteMatrix> matrix;
  std::vector<std::shared_ptr<const ByteMatrix>> per_group;
  /// all_to_allv of a routed MoE dispatch / combine: the expert split behind the matrix, one for
  /// every group or one per group (ExpertRouting); empty for other collectives.
  std::vector<std::shared_ptr<const ExpertRouting>> expert_routing;
  /// all_to_allv with algo deepep: the deduplicated token counts, one for every group or one per
  /// group. dedup_combine: the combine direction (expert GPUs -> the tokens' GPUs: gathered and
  /// reduced on the forwarding GPU, then one message per node back), else the dispatch.
  std::vector<std::shared_ptr<const NodeDedup>> node_dedup;
  bool dedup_combine = false;
  /// send_recv: group position offset of the peer (pos -> (pos + peer_offset) mod W).
  int peer_offset = 1;
  /// saa (Parm's simultaneous all-to-all + all-gather): the inner all-gather group size m;
  /// group position p = a * m + t (t: position in the all-gather, whose groups are the blocks of
  /// m consecutive positions). The all-to-all runs over the positions of the same t (a: the
  /// all-to-all index; MP ranks on GPUs of their own), or, with saa_a2a_spans_group, over all W
  /// positions (index p; the overlapped layout, where the MP ranks are the EP x ESP GPUs).
  int sub_group = 1;
  bool saa_a2a_spans_group = false;
  /// all_to_allv of a pipeline stage send (strategies/stage_schedule: one rank's activation or
  /// gradient to the next stage's): run as an all_to_allv, reported with the sends
  /// (Breakdown::send_recv_s), not with the MoE all-to-alls.
  bool stage_send = false;
};

struct CopySpec {
  Bytes bytes{0};  // bytes read (and written) per rank
};

/// What an op is in the model, for the backends that move real data (exec): the plan builder
/// sets it where it creates the op, so no backend parses a label. kNone: no data path reads the
/// op (dense layers, other collectives). The MoE kinds are the layer's data steps (docs/model.md);
/// the Parm kinds exist only in Parm's schedules (strategies/schedules/parm.hpp).
enum class OpRoleKind : std::uint8_t {
  kNone,
  kGate,
  kEncode,
  kDispatch,  // per chunk
  kFc1,       // per chunk
  kFc2,       // per chunk
  kCombine,   // per chunk
  kDecode,
  kParamGather,       // sharded experts: the expert weights' all-gather (backward: the
                      // reduce-scatter of their gradients)
  kPartialSum,        // sharded experts: the partial outputs' sum
  kEspAllGather,      // Parm baseline: the ESP all-gather before the dispatch
  kEspAllReduce,      // per chunk
  kCombineSaa,        // per chunk: Parm S2's combine through SAA
  kParmLocalDump,     // Parm: esp copies of the MP share (replaces the ESP all-gather)
  kParmLocalCombine,  // Parm: the sum of the esp partial outputs
  kParmJoin,          // Parm with esp 1: joins the chunks' combines
  kParmMpAllGather,   // Parm S1: the MP all-gather after the decode
  kDenseGradSync,     // the dense parameters' gradient all-reduce (whole, or one Lina micro-op)
  kExpertGradSync,    // the experts' gradient all-reduce over DP (whole, or one Lina micro-op)
  kExpertMpGradSync,  // Parm S1 / S2, disjoint layout: the MP copies' expert gradients summed
};
struct OpRole {
  OpRoleKind kind = OpRoleKind::kNone;
  bool backward = false;
  int block = -1;  // the model block l ("L{l}" of the label)
  int chunk = -1;  // 0-based pipeline chunk (gradient syncs: Lina's micro-op); -1 for neither
};
/// The label of a MoE or Parm data op: "L{block}.{fwd|bwd}.{name}[.c{chunk + 1}]" (docs/model.md),
/// e.g. "L1.fwd.dispatch.c2". The one place the label grammar is written; gradient syncs are
/// labelled by the builder ("L{l}.grad.dense_allreduce[.m{i}]"; a bucket of blocks lo..hi
/// "L{lo}-{hi}.grad.dense_allreduce").
std::string role_label(const OpRole& role);

/// A label with its role: what the plan builder hands Plan::add_*. A plain string converts to a
/// tag with no role (kNone).
struct OpTag {
  std::string label;
  OpRole role;
  OpTag(std::string l) : label(std::move(l)) {}  // NOLINT(google-explicit-constructor)
  OpTag(const char* l) : label(l) {}             // NOLINT(google-explicit-constructor)
  OpTag(std::string l, OpRole r) : label(std::move(l)), role(r) {}
  /// A MoE / Parm data op labelled by role_label.
  explicit OpTag(OpRole r) : label(role_label(r)), role(r) {}
};

struct Op {
  OpId id = -1;
  OpKind kind = OpKind::kCompute;
  RankSet ranks;
  StreamId stream = 0;
  std::vector<OpId> deps;
  int priority = 0;         // higher runs first where a scheduler reorders (Lina)
  Bytes partition_size{0};  // micro-op size for partitioned collectives; 0 = whole
  std::string label;        // "L0.fwd.dispatch.c1"
  OpRole role;              // what exec's data paths read (never the label)
  std::variant<ComputeSpec, CollectiveSpec, CopySpec> spec;

  const ComputeSpec& compute() const { return std::get<ComputeSpec>(spec); }
  const CollectiveSpec& collective() const { return std::get<CollectiveSpec>(spec); }
  const CopySpec& copy() const { return std::get<CopySpec>(spec); }
};

/// One iteration's DAG. Op ids are indices into ops; deps must point to earlier ops (the builder
/// emits in topological order, which validate() checks, so cycles cannot exist).
class Plan {
 public:
  explicit Plan(int num_ranks = 0) : num_ranks_(num_ranks) {}

  int num_ranks() const { return num_ranks_; }
  StreamId stream(const std::string& name);  // find or add
  const std::vector<std::string>& stream_names() const { return streams_; }
  GroupingId add_grouping(Grouping g);
  const Grouping& grouping(GroupingId id) const { return groupings_.at(id); }
  const std::vector<Grouping>& groupings() const { return groupings_; }

  OpId add(Op op);  // assigns the id
  OpId add_compute(RankSet ranks, StreamId stream, ComputeSpec spec, std::vector<OpId> deps,
                   OpTag tag);
  OpId add_collective(StreamId stream, CollectiveSpec spec, std::vector<OpId> deps,
                      OpTag tag);  // ranks = union of the grouping's groups
  OpId add_copy(RankSet ranks, StreamId stream, CopySpec spec, std::vector<OpId> deps, OpTag tag);
  const std::vector<Op>& ops() const { return ops_; }
  std::vector<Op>& mutable_ops() { return ops_; }
  const Op& op(OpId id) const { return ops_.at(id); }

  /// Checks: deps refer to existing earlier ops (no cycles), every dep shares a rank with its op,
  /// ranks within [0, num_ranks), streams known, groupings valid (equal sizes, disjoint, in
  /// range), matrices sized to the group. Throws InputError naming the op and what is wrong.
  void validate() const;

 private:
  int num_ranks_ = 0;
  std::vector<std::string> streams_;
  std::vector<Grouping> groupings_;
  std::vector<Op> ops_;
};

/// A plan of one collective over all `gpus` ranks (one "world" group in rank order) on a "comm"
/// stream: what `moesim simulate --collective` and the validation scorecard time.
/// all_to_allv takes its per-pair bytes from `matrix` (W = gpus; `size` is then only reported),
/// and algo deepep its distinct token counts from `dedup`.
Plan world_collective_plan(int gpus, CollectiveType type, CollectiveAlgo algo, Bytes size,
                           std::shared_ptr<const ByteMatrix> matrix = nullptr,
                           std::shared_ptr<const NodeDedup> dedup = nullptr);

}  // namespace moesim
