// Internal helpers shared by the algorithm files of this folder: call checks, node-grid detection
// for hierarchical algorithms, the analytical cost machinery (cost lines, cached per-group
// summaries) and the factories the registry lists. Not part of the public API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/fabric_cuts.hpp"
#include "topology/topology.hpp"

namespace moesim::collectives::detail {

/// Group size; asserts that the call is complete.
int group_size(const CollectiveCall& call);

/// all_to_allv: the call's matrix, checked to be W x W (InputError otherwise).
const ByteMatrix& require_matrix(const CollectiveCall& call);

/// Calls f(dst, bytes) for the non-zero entries of row `src`, in increasing dst order.
template <typename F>
void for_each_in_row(const ByteMatrix& m, int src, F&& f) {
  const double unit = m.unit.value();
  if (m.dense) {
    const std::uint32_t* row = m.counts.data() + static_cast<size_t>(src) * m.size;
    for (int d = 0; d < m.size; ++d)
      if (row[d] != 0) f(d, unit * row[d]);
  } else {
    for (auto i = m.row_offsets[src]; i < m.row_offsets[src + 1]; ++i)
      if (m.values[i] != 0) f(static_cast<int>(m.cols[i]), unit * m.values[i]);
  }
}

/// A node-aligned group: W = n blocks of m positions; block a = positions [a*m, a*m+m) all on one
/// node (distinct nodes for distinct blocks), and position a*m + j has the same local index on
/// every node (so inter-node peers sit on the same rail / NIC index).
struct NodeGrid {
  int m = 0;  // group members per node
  int n = 0;  // nodes
};
/// The grid, or nullopt with *why saying what breaks alignment.
std::optional<NodeGrid> node_grid(const std::vector<int>& group, const topology::Topology& topo,
                                  std::string* why);

/// Local copy / reduction bandwidth in bytes per second (0 = free); see CostContext.
double copy_bandwidth(const CostContext& ctx);

// ---- Analytical cost lines -------------------------------------------------------------------
// A phase's time as a function of the collective's size S is the upper envelope of lines
//   t(S) = message_latency + messages * message_overhead + alpha + S * s_per_byte,
// one per (rank, side, peer class) (see the formula in collective.hpp). Summaries of this form
// depend only on the topology and the group, so they are cached and evaluated in O(lines).
struct CostLine {
  int messages = 0;
  double alpha_s = 0;
  double s_per_byte = 0;  // seconds per byte of S
  auto operator<=>(const CostLine&) const = default;
};

struct PhaseShape {
  Phase::Kind kind = Phase::Kind::kTransfers;
  std::vector<CostLine> lines;  // kTransfers
  // The fabric cut bound (topology/fabric_cuts.hpp) as more lines: message_latency +
  // cut_alpha_s + S * per_byte + message_overhead * per_overhead, where cut_alpha_s is the
  // largest alpha of a transfer that crosses a cut. They bind only on oversubscribed fabrics.
  std::vector<topology::CutMeter::Line> cut_lines;
  double cut_alpha_s = 0;
  int cut_messages = 0;       // most messages a crossing sender posts (its per-message overhead)
  double local_per_byte = 0;  // HBM bytes per byte of S (self copies, copies, reductions)
  int repeat = 1;
};

struct CostShape {
  std::vector<PhaseShape> phases;
};

/// Sorts, deduplicates and drops lines dominated by another (fewer-or-equal in every field).
void prune_lines(std::vector<CostLine>& lines);
/// Time of one phase shape at size S.
double phase_time_s(const PhaseShape& shape, double size, const CostContext& ctx);
/// Time of a whole shape at size S.
double shape_time_s(const CostShape& shape, double size, const CostContext& ctx);
/// Cost lines of an explicit phase over all its transfers (pair_cost per transfer); byte counts
/// are multiplied by `scale` (1/S of the lowering, so the lines are per byte of S).
PhaseShape phase_shape(const Phase& phase, const topology::Topology& topo, double scale);

// ---- Fabric cuts ---------------------------------------------------------------------------
/// The topology's fabric cuts, computed once per topology.
std::shared_ptr<const topology::FabricCuts> fabric_cuts(const topology::Topology& topo);
/// Cut bound of a uniform exchange over the group (every member sends one chunk to every other
/// member: the all-to-all, whatever its algorithm, moves these bytes across the cuts): max over
/// tiers and classes of n_c (W - n_c) (chunk + overhead x injection) / capacity, n_c the members
/// inside class c (the same class maximises both terms). Cached per group.
struct UniformCut {
  double s_per_byte = 0;  // max over classes of n_c (W - n_c) / capacity
  double injection = 0;   // bytes/s of a member's injection link towards other nodes (max)
  double seconds(double chunk_bytes, double overhead_s) const {
    return (chunk_bytes + overhead_s * injection) * s_per_byte;
  }
};
const UniformCut& uniform_exchange_cut(const CollectiveCall& call, const topology::Topology& topo);
/// Cut bound of an all_to_allv's matrix over the group, in seconds (O(non-zeros x tiers)).
double matrix_cut_s(const ByteMatrix& mat, const std::vector<int>& group,
                    const topology::Topology& topo, double overhead_s);

/// Alpha/bandwidth summary of one rank towards a set of peers.
struct ClassStats {
  int count = 0;
  double max_alpha_s = 0;
  double sum_inv_bw = 0;  // sum of 1 / pair bandwidth (seconds per byte)
  void add(const topology::PairCost& pc);
  void merge_max(const ClassStats& o);  // max of each field (over representative ranks)
  double mean_inv_bw() const { return count == 0 ? 0.0 : sum_inv_bw / count; }
};

/// Representative group positions for the per-rank summaries of all-to-all algorithms: every
/// position for small groups (exact), else 8 evenly spaced ones including the first and last.
/// On the built-in topologies every rank sees the same multiset of peer costs, so this is exact
/// there; on irregular ones it samples.
std::vector<int> representative_positions(int group_size);

// ---- Cache -----------------------------------------------------------------------------------
// Per-(topology, group, tag, extra) summaries. The topology is identified by its address plus a
// fingerprint of its contents (sizes, a sample of link bandwidths/latencies, NIC shares), so a
// topology rebuilt at a freed address with other parameters does not alias. Thread-safe; a small
// per-thread memo of recent hits avoids hashing and locking in tight loops.
std::shared_ptr<const void> cache_find(const topology::Topology& topo, int tag, int extra,
                                       const std::vector<int>& group);
void cache_insert(const topology::Topology& topo, int tag, int extra, const std::vector<int>& group,
                  std::shared_ptr<const void> value);

template <typename T, typename Build>
std::shared_ptr<const T> cached(const topology::Topology& topo, int tag, int extra,
                                const std::vector<int>& group, Build&& build) {
  if (auto hit = cache_find(topo, tag, extra, group)) return std::static_pointer_cast<const T>(hit);
  auto value = std::make_shared<const T>(build());
  cache_insert(topo, tag, extra, group, value);
  return value;
}

/// Cache tags (one per kind of summary).
enum CacheTag : int {
  kTagLinearA2a = 1,
  kTagTwoDhA2a,
  kTagLinearProfile,
  kTagTwoDhProfile,
  kTagRingAllReduce,
  kTagTreeAllReduce,
  kTagHierAllReduce,
  kTagRingAllGather,
  kTagRingReduceScatter,
  kTagSendRecv,
  kTagGrid,
  kTagFabricCuts,
  kTagUniformCut,
  kTagLeafGrid,
  kTagThreeDhA2a,
};

/// node_grid() of a group, cached (hierarchical algorithms ask on every applicable() and
/// analytical_time() call).
struct GridInfo {
  std::optional<NodeGrid> grid;
  std::string why;  // when !grid
};
std::shared_ptr<const GridInfo> grid_info(const std::vector<int>& group,
                                          const topology::Topology& topo);

/// Shape of a collective whose lowering scales linearly with spec.bytes: lowers it once at a
/// reference size (without layout) and converts every phase with phase_shape; cached.
std::shared_ptr<const CostShape> scaled_shape(const Algorithm& algo, const CollectiveCall& call,
                                              const topology::Topology& topo, int tag, int extra);
/// analytical_time of such a collective: its scaled_shape evaluated at spec.bytes.
Seconds scaled_time(const Algorithm& algo, const CollectiveCall& call, const CostContext& ctx,
                    int tag, int extra);

/// Per-representative-rank class summaries for all-to-all algorithms.
struct LinearProfile {
  std::vector<ClassStats> intra, inter;  // per representative rank
  ClassStats intra_max, inter_max;       // field-wise max over representatives
};
std::shared_ptr<const LinearProfile> linear_profile(const CollectiveCall& call,
                                                    const topology::Topology& topo);
struct TwoDhProfile {
  NodeGrid grid;
  std::vector<ClassStats> intra, rail;  // node peers; same-local-index peers on other nodes
  ClassStats intra_max, rail_max;
};
std::shared_ptr<const TwoDhProfile> two_dh_profile(const CollectiveCall& call,
                                                   const topology::Topology& topo,
                                                   const NodeGrid& grid);

// ---- Factories listed by registry.cpp (one per algorithm file) -------------------------------
const Algorithm& linear_all_to_all();
const Algorithm& two_dh_all_to_all();
const Algorithm& three_dh_all_to_all();
const Algorithm& linear_all_to_allv();
const Algorithm& two_dh_all_to_allv();
const Algorithm& ring_all_reduce();
const Algorithm& tree_all_reduce();
const Algorithm& hierarchical_all_reduce();
const Algorithm& ring_all_gather();
const Algorithm& ring_reduce_scatter();
const Algorithm& send_recv();
const Algorithm& saa_all_to_all();
const Algorithm& deepep_all_to_allv();

// ---- Lowering helpers shared by several algorithms ---------------------------------------------

/// The InputError-checked grid of a node-aligned group; `what` names the algorithm in the message
/// ("2dh all_to_all").
NodeGrid require_grid(const CollectiveCall& call, const topology::Topology& topo,
                      std::string_view what);

/// Appends the transfers of step 0 of a ring over `ring` (global ranks in ring order): position
/// p sends chunk (p + send_shift) mod R of chunk_bytes to position p+1; the chunk keeps its index
/// on the receiver (in-place rings), at base_offset + index * chunk_bytes on both sides.
void append_ring_step(Phase& phase, const std::vector<int>& ring, double chunk_bytes,
                      int send_shift, double base_offset, bool with_layout);

/// Phase labels of one level of ring collectives (Phase::label is a view: static strings only).
struct RingLabels {
  std::string_view rs_step, rs_reduce, ag_step;
};
inline constexpr RingLabels kFlatRing{"rs_step", "rs_reduce", "ag_step"};
inline constexpr RingLabels kIntraNodeRings{"intra_rs_step", "intra_rs_reduce", "intra_ag_step"};
inline constexpr RingLabels kInterNodeRings{"inter_rs_step", "inter_rs_reduce", "inter_ag_step"};

/// In-place ring reduce-scatter in kRecv over parallel rings of equal size R (ring i's chunks at
/// base i * ring_stride): one kTransfers phase repeated R-1 times whose step t sends chunk
/// (p - t - 1) mod R of chunk_bytes to the successor, so position p ends owning reduced chunk p;
/// then one kReduce phase with the R-1 reductions (3 * chunk_bytes each: read 2, write 1). Phases
/// run in sequence, so one reduction phase after the steps costs the same as interleaving them.
/// Appends nothing when there are no rings or R < 2.
void append_ring_reduce_scatter(std::vector<Phase>& phases, std::span<const std::vector<int>> rings,
                                double chunk_bytes, double ring_stride, const RingLabels& labels,
                                bool with_layout);
/// In-place ring all-gather in kRecv over the same rings: one kTransfers phase repeated R-1 times
/// whose step t sends chunk (p - t) mod R, starting from the chunk p each position owns (after a
/// reduce-scatter, or a self copy). A ring all_reduce is append_ring_reduce_scatter followed by
/// append_ring_all_gather over the same rings.
void append_ring_all_gather(std::vector<Phase>& phases, std::span<const std::vector<int>> rings,
                            double chunk_bytes, double ring_stride, const RingLabels& labels,
                            bool with_layout);

/// One level of a hierarchical all_to_all (2dh, 3dh) over a group of W = group.size() positions
/// of chunk_bytes each: `copy` becomes the stride copy T(dim, W / dim) that gathers each block,
/// `exchange` the exchange along the level's `dim` positions (stride `stride` apart): position p,
/// index own = (p / stride) % dim, sends block k (slots [k * other, k * other + other), other =
/// W / dim) to the peer of index k, landing at the peer's block own. The caller sets kinds,
/// labels and buffers.
void fill_level_exchange(Phase& copy, Phase& exchange, const std::vector<int>& group, int dim,
                         int stride, double chunk_bytes, bool with_layout);

/// Indices of the four 2DH phases (buffer layout in collective.hpp).
enum TwoDhPhaseIndex : int { kStrideCopy1 = 0, kIntra, kStrideCopy2, kInter };
/// The four 2DH phases of all_to_all and all_to_allv with their kinds, labels and buffers
/// (stride_copy_1 kSend -> kScratch, intra kScratch -> kRecv, stride_copy_2 kRecv -> kScratch,
/// inter kScratch -> kRecv); the caller fills sizes, strides, transfers and copies.
std::vector<Phase> two_dh_phases();

/// One rank's part of a 2DH exchange phase (intra: peers are the node's ranks; inter: the ranks
/// of the same local index on other nodes). The rank (global rank `rank`) is index `own` of the
/// `count` peers along the exchanged dimension; peer index k is global rank peer_rank(k) and gets
/// bytes(k) bytes from send_offset(k) of the rank's src buffer to recv_offset(k) of the peer's dst
/// buffer. Peers are visited from own + 1 upwards (mod count), empty blocks send nothing, and the
/// own block is a LocalCopy (with layout only, as all layout data).
template <typename PeerRank, typename BlockBytes, typename SendOffset, typename RecvOffset>
void append_exchange(Phase& phase, int rank, int own, int count, PeerRank&& peer_rank,
                     BlockBytes&& bytes, SendOffset&& send_offset, RecvOffset&& recv_offset,
                     bool with_layout) {
  for (int i = 1; i < count; ++i) {
    const int k = (own + i) % count;
    const double v = bytes(k);
    if (v <= 0) continue;
    phase.transfers.push_back({rank, peer_rank(k), v});
    if (with_layout) phase.chunks.push_back({send_offset(k), recv_offset(k)});
  }
  if (with_layout && bytes(own) > 0)
    phase.copies.push_back({rank, send_offset(own), recv_offset(own), bytes(own)});
}

}  // namespace moesim::collectives::detail
