// The `cluster:` section of a scenario: which GPUs, how they are wired inside a node and between
// nodes. Plain data filled by the YAML loader (core/scenario_loader) and turned into a graph by
// topology::build_topology. Every field is in base units (see core/units.hpp).
//
// Latency convention (ours): `latency` of a tier is the one-way latency between two endpoints
// attached to the same switch of that tier; each link of that tier carries half of it. A path's
// latency (its alpha) is the sum of its links' latencies: GPU-NVSwitch-GPU costs intra.latency,
// NIC-leaf-NIC costs inter.latency, NIC-leaf-spine-leaf-NIC costs 2 * inter.latency.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/units.hpp"

namespace moesim {

enum class Dtype { kFp32, kTf32, kFp16, kBf16, kFp8 };
std::string_view dtype_name(Dtype d);
/// Bytes per element: fp32/tf32 4, fp16/bf16 2, fp8 1.
int dtype_bytes(Dtype d);

/// A GPU model: either resolved from the catalog by name, or given inline as a map.
struct GpuSpec {
  std::string name;                      // catalog name ("a100-sxm-80gb") or user label
  bool from_catalog = true;              // false when given inline
  std::map<Dtype, FlopsPerSecond> peak;  // dense tensor-core peak per dtype (no sparsity)
  BytesPerSecond hbm_bandwidth{0};
  Bytes memory{0};
  BytesPerSecond nvlink_bandwidth{0};  // per GPU per direction, 0 when the GPU has no NVLink
  BytesPerSecond pcie_bandwidth{0};    // host link per direction
  /// Streaming multiprocessors; 0 when unknown (an inline GPU without `sms`). Communication
  /// kernels hold some of them, which is what slows compute beside them (engine.interference).
  int sms = 0;
  /// L2 cache; 0 when unknown. Batch items of a GEMM that share a weight matrix (the plain
  /// layout's W sources of one expert) read it from HBM once while the shared weights fit here.
  Bytes l2_cache{0};
  SourceLocation where;  // location of the `gpu:` key, for later errors
};

enum class IntraKind { kNvswitch, kNvlinkRing, kPcie };
std::string_view intra_kind_name(IntraKind k);

struct IntraNodeSpec {
  IntraKind kind = IntraKind::kNvswitch;
  BytesPerSecond bandwidth{0};  // per GPU per direction (NVSwitch port / ring link / PCIe slot)
  // Fraction of the spec-sheet bandwidth transfers achieve (`intra_node.efficiency`); 0 = the
  // link kind's (topology::default_intra_efficiency). The topology builder keeps the spec-sheet
  // figure in nominal_bandwidth and sets bandwidth to nominal x efficiency.
  double efficiency = 0;
  BytesPerSecond nominal_bandwidth{0};
  Seconds latency{1e-6};
  // pcie only: GPUs under one PCIe switch, and how many CPU sockets (host bridges) the
  // switches hang off; sockets are joined by an inter-socket link.
  int gpus_per_pcie_switch = 2;
  int sockets = 1;
  BytesPerSecond socket_link_bandwidth{0};  // 0 = same as `bandwidth`
};

enum class InterKind { kNone, kSwitch, kFatTree, kRailOptimized, kDragonfly, kTree, kCustom };
std::string_view inter_kind_name(InterKind k);

/// TA-MoE nested-list notation: a list is a switch whose children are the list's items; an
/// integer n is a leaf switch with n nodes attached. [[2,2],[2]] = a root over two switches, the
/// first over two leaf switches of 2 nodes each, the second over one leaf switch of 2 nodes.
struct TreeSpec {
  bool is_leaf = false;
  int leaf_nodes = 0;              // when is_leaf
  std::vector<TreeSpec> children;  // when !is_leaf
};

/// How flows use the equal-cost uplinks of a fat tree (or rail-optimized fabric).
/// - kDmodk (default): destination-mod-k, the static InfiniBand "ftree" routing OpenSM installs:
///   at every up-going hop a switch picks among its k equal-cost up-ports by the destination's
///   index (NICs numbered leaf by leaf, port by port) divided by the product of the k's of the
///   hops below, mod k. Every destination has exactly one spine / core and a dedicated down path,
///   and shift / all-to-all traffic spreads evenly over the uplinks.
/// - kHash: each flow takes one path picked by a per-(src, dst, hop) hash (RoCE / Ethernet ECMP;
///   collisions make some uplinks carry more flows than others).
/// - kSpray: every flow is split evenly over all equal-cost uplinks (what InfiniBand adaptive
///   routing approximates), so a switch's parallel uplinks act as one link of their summed
///   bandwidth.
enum class EcmpMode { kDmodk, kHash, kSpray };

struct InterNodeSpec {
  InterKind kind = InterKind::kNone;
  // `inter_node.nic`: the NIC model's catalog name (topology/nic_catalog.hpp); empty = the one
  // that fits the GPU's generation. It gives the line rate when nic_bandwidth is unset, the
  // achievable fraction, and the queue-pair cache the engines' per-peer costs read.
  std::string nic;
  BytesPerSecond nic_bandwidth{0};  // per NIC per direction; 0 = the NIC model's line rate
  // As IntraNodeSpec::efficiency, for the NICs (`inter_node.nic_efficiency`; 0 = the default,
  // topology::kNicEfficiency); the fabric's links are sized from the achieved rate.
  double nic_efficiency = 0;
  BytesPerSecond nominal_nic_bandwidth{0};
  int nics_per_node = 1;
  Seconds latency{2e-6};
  double oversubscription = 1.0;  // fat_tree / rail_optimized: down/up capacity ratio at a leaf
  int switch_radix = 64;          // ports per switch (fat_tree / rail_optimized sizing)
  int levels = 0;                 // fat_tree: 2 or 3; 0 = smallest that fits
  // fat_tree / rail_optimized: how a flow uses the equal-cost uplinks (`inter_node.ecmp`).
  EcmpMode ecmp = EcmpMode::kDmodk;
  // dragonfly
  int groups = 0;
  int routers_per_group = 0;           // 0 = auto
  BytesPerSecond global_bandwidth{0};  // per global link; 0 = nic_bandwidth
  BytesPerSecond local_bandwidth{0};   // per router-router link in a group; 0 = nic_bandwidth
  // tree
  TreeSpec tree;
  std::vector<BytesPerSecond> tree_level_bandwidth;  // bottom-up per switch level; empty = auto
};

/// `cluster.custom`: explicit vertices and links. GPUs are `gpu0..gpu{P-1}`, NICs and switches
/// are named by the user.
struct CustomVertex {
  std::string name;
  std::string kind;  // gpu | nic | nvswitch | pcie_switch | host_bridge | switch
  int node = -1;     // for gpu/nic: the node it belongs to
  SourceLocation where;
};
struct CustomLink {
  std::string a, b;
  BytesPerSecond bandwidth{0};
  Seconds latency{0};
  SourceLocation where;
};
struct CustomTopologySpec {
  std::vector<CustomVertex> vertices;
  std::vector<CustomLink> links;
};

struct ClusterSpec {
  GpuSpec gpu;
  int nodes = 1;
  int gpus_per_node = 1;
  IntraNodeSpec intra;
  InterNodeSpec inter;
  std::optional<CustomTopologySpec> custom;  // only with inter.kind == kCustom
  std::string calibration_path;              // resolved relative to the scenario file
  SourceLocation where;                      // location of the `cluster:` key
  // Label of this cluster in reports (`compare --topology`): the scenario's or topology file's
  // `name:`, else the file stem.
  std::string name;
  // Every key path present in the file ("cluster.inter_node.groups", "cluster.custom.links[2]")
  // mapped to its location, so later layers can raise InputError at the offending line.
  std::map<std::string, SourceLocation> locations;

  int num_gpus() const { return nodes * gpus_per_node; }
  /// Location of `key_path` if it was present in the file, else of the `cluster:` key.
  SourceLocation location_of(const std::string& key_path) const;
};

}  // namespace moesim
