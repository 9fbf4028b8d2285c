// The cluster as a graph: GPUs, NVSwitches, PCIe switches, host bridges, NICs and network switches
// joined by full-duplex links. Built from a ClusterSpec by build_topology(); read by the network
// models (routes, link capacities), the analytical cost models and TA-MoE (per-pair alpha/beta,
// tiers) and `moesim topo`.
//
// Scale: 4,096 GPUs and beyond. Nothing here stores P^2 routes: routes are computed on demand from
// per-node templates plus switch-level next-hop tables, in O(path length).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/units.hpp"

namespace moesim::topology {

enum class VertexKind { kGpu, kNvswitch, kPcieSwitch, kHostBridge, kNic, kSwitch };
std::string_view vertex_kind_name(VertexKind k);

using VertexId = std::uint32_t;
/// Directed link id. A full-duplex cable is two directed links with ids 2c and 2c+1, so the two
/// directions never share capacity ("opposite directions do not share").
using LinkId = std::uint32_t;

struct Vertex {
  VertexKind kind;
  int node = -1;     // node index for GPUs, NICs and node-local switches; -1 for fabric switches
  int index = -1;    // GPU: global rank; NIC: local NIC index; switch: index within its kind
  int level = 0;     // fabric switches: 1 = leaf/rail/router, 2 = spine/group, 3 = core; else 0
  std::string name;  // "gpu12", "node1.nic0", "leaf3", ...
};

struct Link {
  VertexId src, dst;
  BytesPerSecond bandwidth;  // per direction
  Seconds latency;
  int tier = 0;  // 0 inside a node; 1 NIC-leaf; 2 leaf-spine / dragonfly local; 3 core / global
};

/// alpha/beta between two GPUs as the analytical model and TA-MoE read them.
struct PairCost {
  Seconds alpha{0};             // sum of link latencies on the route
  BytesPerSecond bandwidth{0};  // bottleneck: min over route links, and for inter-node pairs
                                // the NIC bandwidth divided by the GPUs sharing that NIC
  int hops = 0;                 // links on the route
  int tier = 0;                 // 0 same node, then the highest link tier on the route
  double beta() const { return 1.0 / bandwidth.value(); }  // seconds per byte
};

struct TierRow {
  int tier = 0;
  std::int64_t pairs = 0;  // ordered GPU pairs (src != dst) in this tier
  int min_hops = 0, max_hops = 0;
  Seconds min_alpha{0}, max_alpha{0};
  BytesPerSecond min_bandwidth{0}, max_bandwidth{0};
};

class Topology {
 public:
  virtual ~Topology() = default;

  const ClusterSpec& spec() const { return spec_; }
  const GpuSpec& gpu() const { return spec_.gpu; }
  /// Unique per Topology object built in this process (a counter, never reused): caches of
  /// derived quantities key on it, since a topology never changes after construction and an
  /// address can be reused by the next topology once this one is freed.
  std::uint64_t instance_id() const { return instance_id_; }
  int num_gpus() const { return spec_.num_gpus(); }
  int num_nodes() const { return spec_.nodes; }
  int gpus_per_node() const { return spec_.gpus_per_node; }
  int node_of(int gpu) const { return gpu / spec_.gpus_per_node; }
  int local_of(int gpu) const { return gpu % spec_.gpus_per_node; }

  const std::vector<Vertex>& vertices() const { return vertices_; }
  const std::vector<Link>& links() const { return links_; }  // directed; see LinkId
  VertexId gpu_vertex(int gpu) const { return gpu_vertex_[gpu]; }

  /// Appends the directed links from GPU src to GPU dst (src != dst) to `out`. Shortest path
  /// (hop count); among equal-cost fabric next hops, fat_tree and rail_optimized follow
  /// cluster.inter_node.ecmp (default d-mod-k: up-port by destination NIC index, see EcmpMode),
  /// everything else (and intra-node alternatives) a deterministic hash of (src, dst, hop).
  /// GPUs are never transit vertices except on nvlink_ring nodes.
  /// O(path length), allocates nothing beyond appending to `out`.
  virtual void route(int src, int dst, std::vector<LinkId>& out) const = 0;
  /// alpha/beta of the route(src, dst) path (src == dst: zero latency at HBM bandwidth).
  PairCost pair_cost(int src, int dst) const;
  int tier(int src, int dst) const { return pair_cost(src, dst).tier; }

  /// One row per tier present, over all ordered GPU pairs.
  std::vector<TierRow> tier_table() const;
  /// Max-flow between the first and second half of the GPUs (by rank), per direction.
  BytesPerSecond bisection_bandwidth() const;
  /// How many GPUs of a node send through the same NIC (1 if each has its own; 0 without NICs).
  int gpus_per_nic() const { return gpus_per_nic_; }
  /// The share of its NIC one GPU gets when all GPUs on that NIC send: NIC bandwidth divided by
  /// the GPUs using that NIC (0 without NICs).
  BytesPerSecond nic_share_bandwidth(int gpu) const {
    return gpu < static_cast<int>(nic_share_bandwidth_.size()) ? nic_share_bandwidth_[gpu]
                                                               : BytesPerSecond(0);
  }

 protected:
  explicit Topology(ClusterSpec spec) : spec_(std::move(spec)), instance_id_(next_instance_id()) {}
  /// pair_cost() and tier_table() dispatch here. The defaults walk route(); builders with
  /// per-node templates override them with cached path summaries (same answers, faster).
  virtual PairCost compute_pair_cost(int src, int dst) const;
  virtual std::vector<TierRow> compute_tier_table() const;
  static std::uint64_t next_instance_id();

  ClusterSpec spec_;
  std::uint64_t instance_id_ = 0;
  std::vector<Vertex> vertices_;
  std::vector<Link> links_;
  std::vector<VertexId> gpu_vertex_;
  int gpus_per_nic_ = 0;
  std::vector<BytesPerSecond> nic_share_bandwidth_;  // per GPU; see nic_share_bandwidth()
};

/// Builds the graph for spec (intra-node builder x inter-node builder, or custom). Throws
/// InputError (with spec locations) for inconsistent specs, e.g. an unknown GPU name. The GPU is
/// resolved from the catalog (gpu_catalog.hpp) and defaults are filled into spec().
///
/// Modelling choices (latencies: every link of a tier carries half the tier's latency):
/// - nvswitch: GPU <-> one NVSwitch vertex per node at intra.bandwidth (the GPU's port limit).
///   nvlink_ring: GPU i <-> GPU i+1 mod m; a direct link carries the whole intra.latency.
///   pcie: GPUs under PCIe switches (gpus_per_pcie_switch each, one x16 uplink at
///   intra.bandwidth), switches under sockets, sockets joined pairwise.
/// - NICs: local GPU i uses NIC floor(i * nics / gpus). NVLink nodes: a GPU-NIC link of the GPU's
///   PCIe bandwidth; pcie nodes: the NIC hangs off the PCIe switch of its first GPU. NIC-switch
///   links carry nic_bandwidth and tier 1.
/// - fat_tree: a leaf has round(radix * o / (1 + o)) NIC ports (whole nodes per leaf when they
///   fit) and round(ports / o) uplinks, one per spine (per pod aggregation switch in 3 levels);
///   parallel cables are one link of summed bandwidth. 3 levels: radix/2 leaves per pod, core
///   groups of ceil(pods / 2) switches per aggregation index. ecmp spray: one summed uplink per
///   leaf (and per aggregation switch), one spine / core.
/// - rail_optimized: NIC k of every node on rail k (several leaves per rail when the nodes do not
///   fit one), every rail leaf to every spine, sized as fat_tree leaves.
/// - dragonfly: node n in group floor(n * groups / nodes) (0 groups = ceil(sqrt(nodes))), spread
///   over the group's routers (0 = enough routers for radix/4 terminal ports each); all-to-all
///   local links (tier 2) and one global link per pair of groups (tier 3); shortest routing.
/// - tree: level of a switch = its height (leaf switches 1); the uplink of a level-l switch is
///   tree_level_bandwidth[l-1], or what is below it / oversubscription.
/// - custom: the listed graph; GPUs gpu0..gpu{P-1} are implicit; a switch's level is 1 next to a
///   non-switch, else one more than its nearest level-1 switch; a link's tier is the highest level
///   at its ends.
std::unique_ptr<Topology> build_topology(const ClusterSpec& spec);

/// GraphViz (undirected `graph`): one node per vertex, one edge per full-duplex cable labelled
/// with its per-direction bandwidth and latency. Writes everything, however big.
void write_dot(const Topology& topo, std::ostream& os);

}  // namespace moesim::topology
