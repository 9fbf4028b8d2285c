// Built-in topologies: every node is built from the same intra-node template (nvswitch,
// nvlink_ring, pcie), NICs hang off each node, and an inter-node fabric of switches (switch,
// fat_tree, rail_optimized, dragonfly, tree) joins the NICs.
//
// Routing never stores per-pair routes. Because all nodes are alike, node n's vertices and links
// are node 0's shifted by n * (vertices or links per node), so the GPU<->GPU and GPU<->NIC paths
// inside a node are computed once on node 0 ("templates") and shifted. Between NICs, a table over
// the fabric switches only gives, for each (switch, destination switch), the equal-cost next
// hops; route() walks it in O(path length), choosing among next hops by destination-mod-k (the
// default for fat_tree / rail_optimized: InfiniBand static ftree routing) or by the ECMP hash.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include "core/error.hpp"
#include "topology/detail.hpp"

namespace moesim::topology::detail {

namespace {

constexpr std::uint16_t kUnreached = std::numeric_limits<std::uint16_t>::max();
// Equal-cost alternatives kept per intra-node pair (a ring has at most 2; PCIe trees have 1).
constexpr std::size_t kMaxAlternatives = 16;

int ceil_div(std::int64_t a, std::int64_t b) { return static_cast<int>((a + b - 1) / b); }

/// A path stored as a range of link offsets, with its summary.
struct Alt {
  std::uint32_t begin = 0;
  std::uint32_t len = 0;
  PathSummary sum;
};

/// A next hop in the fabric table: the link to take and the switch index it leads to.
struct Candidate {
  LinkId link;
  std::uint32_t next;
};

struct CandidateRange {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
};

struct FabricSummary {
  PathSummary sum;
  bool uniform = false;  // every equal-cost path from here has this same summary
};

class StructuredTopology final : public Topology {
 public:
  explicit StructuredTopology(const ClusterSpec& spec);
  void route(int src, int dst, std::vector<LinkId>& out) const override;

 protected:
  PairCost compute_pair_cost(int src, int dst) const override;
  std::vector<TierRow> compute_tier_table() const override;

 private:
  // --- construction
  void build_nodes();
  void build_single_switch();
  void build_fat_tree();
  void build_rail_optimized();
  void build_dragonfly();
  void build_tree();
  VertexId add_switch(int level, std::string name);
  VertexId nic_vertex(int node, int k) const {
    return static_cast<VertexId>(node * verts_per_node_ + m_ + intra_switches_ + k);
  }
  void attach_nic(int node, int k, VertexId sw);
  void build_templates(const Graph& g);
  void build_fabric_tables(const Graph& g);
  /// Leaf-spine split: NIC ports in use (a multiple of `granularity` when possible), uplinks
  /// (one per spine) and each uplink's bandwidth, so that down/up is the oversubscription.
  void leaf_ports(int granularity, int& down, int& up, BytesPerSecond& up_bw) const;

  // --- queries
  const Alt& local_alt(int src, int dst) const {
    const int i = src % m_, j = dst % m_;
    const std::uint32_t first = local_alt_off_[i * m_ + j];
    const std::uint32_t n = local_alt_off_[i * m_ + j + 1] - first;
    return alts_[first + ecmp_pick(src, dst, 0, n)];
  }
  void append(const Alt& a, int node, std::vector<LinkId>& out) const {
    const LinkId base = static_cast<LinkId>(node) * links_per_node_;
    for (std::uint32_t x = 0; x < a.len; ++x) out.push_back(base + tmpl_[a.begin + x]);
  }
  /// Walks the fabric from switch s to the switch of global NIC g2 (GPU src -> GPU dst).
  template <typename Visit>
  void walk_fabric(int src, int dst, std::size_t g2, std::uint32_t s, Visit&& visit) const {
    const std::uint32_t d = nic_dest_[g2];
    const std::uint32_t target = dest_switch_[d];
    // d-mod-k: the up-port at a hop with k choices is (index / product of the k's below) mod k,
    // so destinations spread over every level's ports in turn and each has a single path.
    std::uint32_t key = nic_order_[g2];
    for (int hop = 0; s != target; ++hop) {
      const std::size_t cell = static_cast<std::size_t>(s) * num_dest_ + d;
      const CandidateRange r = cells_[cell];
      std::uint32_t pick = 0;
      if (r.count > 1) {
        if (dmodk_) {
          pick = key % r.count;
          key /= r.count;
        } else {
          pick = ecmp_pick(src, dst, hop, r.count);
        }
      }
      const Candidate& c = cand_[r.first + pick];
      visit(c.link);
      s = c.next;
    }
  }
  /// Summary of exactly the path route(src, dst) takes (src != dst), NIC share included.
  PathSummary summary(int src, int dst) const;
  PathSummary inter_summary(int src, int dst, int n1, int n2) const;

  int m_ = 1;     // GPUs per node
  int nics_ = 0;  // NICs per node (0 without a fabric)
  int intra_switches_ = 0;
  std::uint32_t verts_per_node_ = 0;
  std::uint32_t links_per_node_ = 0;

  // Node templates (node 0; offsets relative to the node's first link).
  std::vector<std::uint32_t> tmpl_;
  std::vector<std::uint32_t> local_alt_off_;  // m*m + 1 offsets into alts_
  std::vector<Alt> alts_;
  std::vector<Alt> up_, down_;        // per local GPU: GPU -> its NIC, its NIC -> GPU
  std::vector<int> gpu_nic_;          // per local GPU: local NIC index
  std::vector<VertexId> nic_attach_;  // pcie: per local NIC, the PCIe switch it hangs off

  // Fabric, indexed by global NIC (node * nics + k) and by switch index.
  std::vector<LinkId> nic_up_, nic_down_;
  std::vector<std::uint32_t> nic_switch_, nic_dest_;
  // d-mod-k destination index per global NIC: NICs numbered switch by switch (in switch index
  // order), in attachment (port) order within a switch, as OpenSM's ftree numbers them.
  std::vector<std::uint32_t> nic_order_;
  bool dmodk_ = false;  // route by d-mod-k instead of the ECMP hash
  std::vector<VertexId> switch_vertex_;
  std::vector<std::uint32_t> dest_switch_;  // destination index -> switch index
  std::uint32_t num_dest_ = 0;
  // [switch * num_dest_ + dest] -> equal-cost next hops, a range of cand_. Identical lists are
  // stored once (a leaf's uplinks serve every remote destination), which keeps the table small
  // enough to stay in cache on the route() hot path.
  std::vector<CandidateRange> cells_;
  std::vector<Candidate> cand_;
  std::vector<FabricSummary> fabric_sum_;  // [switch * num_dest_ + dest]
};

StructuredTopology::StructuredTopology(const ClusterSpec& spec) : Topology(spec) {
  m_ = spec_.gpus_per_node;
  nics_ = spec_.inter.kind == InterKind::kNone ? 0 : spec_.inter.nics_per_node;
  gpu_vertex_.resize(num_gpus());
  build_nodes();
  switch (spec_.inter.kind) {
    case InterKind::kNone:
      break;
    case InterKind::kSwitch:
      build_single_switch();
      break;
    case InterKind::kFatTree:
      build_fat_tree();
      break;
    case InterKind::kRailOptimized:
      build_rail_optimized();
      break;
    case InterKind::kDragonfly:
      build_dragonfly();
      break;
    case InterKind::kTree:
      build_tree();
      break;
    case InterKind::kCustom:
      MOESIM_ASSERT(false, "custom topologies are built by build_custom");
  }
  const Graph g = make_graph(vertices_.size(), links_);
  build_templates(g);
  build_fabric_tables(g);
}

void StructuredTopology::build_nodes() {
  const auto& intra = spec_.intra;
  GraphBuilder b(vertices_, links_);
  const Seconds half = intra.latency * 0.5;
  // GPU k of a node uses NIC floor(k * nics / m).
  gpu_nic_.resize(m_);
  for (int i = 0; i < m_; ++i)
    gpu_nic_[i] = nics_ == 0 ? -1 : static_cast<int>(std::int64_t{i} * nics_ / m_);
  const int num_pcie =
      intra.kind == IntraKind::kPcie ? ceil_div(m_, intra.gpus_per_pcie_switch) : 0;
  const int sockets = intra.kind == IntraKind::kPcie ? intra.sockets : 0;
  intra_switches_ = intra.kind == IntraKind::kNvswitch ? 1 : num_pcie + sockets;

  for (int n = 0; n < spec_.nodes; ++n) {
    const auto node_base = static_cast<VertexId>(vertices_.size());
    const auto link_base = links_.size();
    for (int i = 0; i < m_; ++i) {
      const int rank = n * m_ + i;
      gpu_vertex_[rank] = b.add_vertex(VertexKind::kGpu, n, rank, 0, fmt::format("gpu{}", rank));
    }
    auto gpu = [&](int i) { return node_base + static_cast<VertexId>(i); };
    std::vector<VertexId> pcie, socket;
    VertexId nvswitch = 0;
    if (intra.kind == IntraKind::kNvswitch) {
      nvswitch = b.add_vertex(VertexKind::kNvswitch, n, 0, 0, fmt::format("node{}.nvswitch", n));
    }
    for (int q = 0; q < num_pcie; ++q) {
      pcie.push_back(
          b.add_vertex(VertexKind::kPcieSwitch, n, q, 0, fmt::format("node{}.pcie{}", n, q)));
    }
    for (int s = 0; s < sockets; ++s) {
      socket.push_back(
          b.add_vertex(VertexKind::kHostBridge, n, s, 0, fmt::format("node{}.socket{}", n, s)));
    }
    for (int k = 0; k < nics_; ++k) {
      b.add_vertex(VertexKind::kNic, n, k, 0, fmt::format("node{}.nic{}", n, k));
    }
    if (n == 0) verts_per_node_ = static_cast<std::uint32_t>(vertices_.size() - node_base);

    switch (intra.kind) {
      case IntraKind::kNvswitch:
        // One NVSwitch vertex stands for the node's NVSwitch fabric; the GPU's link to it is the
        // GPU's NVLink port limit (all its NVLinks together), which is what binds in practice.
        for (int i = 0; i < m_; ++i) b.add_cable(gpu(i), nvswitch, intra.bandwidth, half, 0);
        break;
      case IntraKind::kNvlinkRing:
        // A direct GPU-GPU link is the whole endpoint-to-endpoint path, so it carries the full
        // intra-node latency (GPU-NVSwitch-GPU also sums to it). Two GPUs have one link, not two.
        if (m_ == 2) b.add_cable(gpu(0), gpu(1), intra.bandwidth, intra.latency, 0);
        if (m_ > 2) {
          for (int i = 0; i < m_; ++i) {
            b.add_cable(gpu(i), gpu((i + 1) % m_), intra.bandwidth, intra.latency, 0);
          }
        }
        break;
      case IntraKind::kPcie:
        for (int i = 0; i < m_; ++i) {
          b.add_cable(gpu(i), pcie[i / intra.gpus_per_pcie_switch], intra.bandwidth, half, 0);
        }
        // A PCIe switch has one x16 uplink to its socket: GPUs under it share it.
        for (int q = 0; q < num_pcie; ++q) {
          b.add_cable(pcie[q], socket[static_cast<std::int64_t>(q) * sockets / num_pcie],
                      intra.bandwidth, half, 0);
        }
        for (int s = 0; s < sockets; ++s) {
          for (int t = s + 1; t < sockets; ++t) {
            b.add_cable(socket[s], socket[t], intra.socket_link_bandwidth, half, 0);
          }
        }
        break;
    }
    // NIC attachment: a NIC sits on the GPU's PCIe path. On NVLink nodes the GPU-NIC PCIe path is
    // one link of the GPU's PCIe bandwidth; on PCIe nodes the NIC hangs off the PCIe switch of
    // the first GPU that uses it (or spreads over the switches when there are more NICs).
    for (int k = 0; k < nics_; ++k) {
      if (intra.kind != IntraKind::kPcie) continue;
      int first = -1;
      for (int i = 0; i < m_ && first < 0; ++i) {
        if (gpu_nic_[i] == k) first = i;
      }
      const int q = first >= 0 ? first / intra.gpus_per_pcie_switch
                               : static_cast<int>(std::int64_t{k} * num_pcie / nics_);
      b.add_cable(node_base + m_ + intra_switches_ + k, pcie[q], intra.bandwidth, half, 0);
    }
    if (intra.kind != IntraKind::kPcie) {
      const BytesPerSecond pcie_bw = spec_.gpu.pcie_bandwidth.value() > 0
                                         ? spec_.gpu.pcie_bandwidth
                                         : spec_.inter.nic_bandwidth;
      for (int i = 0; i < m_ && nics_ > 0; ++i) {
        b.add_cable(gpu(i), node_base + m_ + intra_switches_ + gpu_nic_[i], pcie_bw, half, 0);
      }
    }
    if (n == 0) {
      links_per_node_ = static_cast<std::uint32_t>(links_.size() - link_base);
    } else {
      MOESIM_ASSERT(links_.size() - link_base == links_per_node_, "nodes must be alike");
    }
  }

  // NIC sharing: GPUs on the same NIC split its bandwidth.
  nic_share_bandwidth_.assign(num_gpus(), BytesPerSecond(0));
  if (nics_ > 0) {
    std::vector<int> users(nics_, 0);
    for (int i = 0; i < m_; ++i) ++users[gpu_nic_[i]];
    gpus_per_nic_ = *std::max_element(users.begin(), users.end());
    for (int r = 0; r < num_gpus(); ++r) {
      nic_share_bandwidth_[r] = spec_.inter.nic_bandwidth / users[gpu_nic_[r % m_]];
    }
  }
  nic_up_.assign(static_cast<std::size_t>(spec_.nodes) * nics_, 0);
  nic_down_ = nic_up_;
  nic_switch_.assign(nic_up_.size(), kUnreached);
}

VertexId StructuredTopology::add_switch(int level, std::string name) {
  GraphBuilder b(vertices_, links_);
  const VertexId v = b.add_vertex(VertexKind::kSwitch, -1, static_cast<int>(switch_vertex_.size()),
                                  level, std::move(name));
  switch_vertex_.push_back(v);
  return v;
}

void StructuredTopology::attach_nic(int node, int k, VertexId sw) {
  GraphBuilder b(vertices_, links_);
  const std::size_t g = static_cast<std::size_t>(node) * nics_ + k;
  const LinkId up =
      b.add_cable(nic_vertex(node, k), sw, spec_.inter.nic_bandwidth, spec_.inter.latency * 0.5, 1);
  nic_up_[g] = up;
  nic_down_[g] = up + 1;
  nic_switch_[g] = static_cast<std::uint32_t>(vertices_[sw].index);
}

void StructuredTopology::leaf_ports(int granularity, int& down, int& up,
                                    BytesPerSecond& up_bw) const {
  const int r = spec_.inter.switch_radix;
  const double o = spec_.inter.oversubscription;
  down = std::clamp(static_cast<int>(std::lround(r * o / (1.0 + o))), 1, r - 1);
  // Whole nodes per leaf when a node's NICs fit one (as clusters are cabled).
  if (down >= granularity) down = down / granularity * granularity;
  // Uplinks are cables like the NICs' (as many as the ratio needs), each leaf-spine link summing
  // its cables, so that down/up capacity is exactly the oversubscription.
  up = std::clamp(static_cast<int>(std::lround(down / o)), 1, r - down);
  up_bw = spec_.inter.nic_bandwidth * (static_cast<double>(down) / (o * up));
}

void StructuredTopology::build_single_switch() {
  const VertexId sw = add_switch(1, "switch");
  for (int n = 0; n < spec_.nodes; ++n) {
    for (int k = 0; k < nics_; ++k) attach_nic(n, k, sw);
  }
}

void StructuredTopology::build_fat_tree() {
  // Leaves have `down` NIC ports and one uplink to each of `up` spines (aggregation switches in
  // 3 levels). Parallel cables between two switches are one link of their summed bandwidth.
  const auto& inter = spec_.inter;
  const int r = inter.switch_radix;
  int down = 0, up = 0;
  BytesPerSecond up_bw;
  leaf_ports(nics_, down, up, up_bw);
  const std::int64_t num_nics = std::int64_t{spec_.nodes} * nics_;
  const int leaves = ceil_div(num_nics, down);
  int levels = inter.levels;
  if (levels == 0) levels = leaves <= r ? 2 : 3;
  if (levels != 2 && levels != 3) {
    throw InputError(spec_.location_of("cluster.inter_node.levels"), "cluster.inter_node.levels",
                     "found " + std::to_string(levels) + ", expected 2 or 3 (or 0 for auto)");
  }
  if (levels == 2 && leaves > r) {
    throw InputError(spec_.location_of("cluster.inter_node.levels"), "cluster.inter_node.levels",
                     "a 2-level fat_tree of radix " + std::to_string(r) + " holds at most " +
                         std::to_string(std::int64_t{down} * r) + " NICs, found " +
                         std::to_string(num_nics) + "; use 3 levels or a larger switch_radix");
  }
  const int per_pod = std::max(1, r / 2);  // an aggregation switch: half its ports down
  const int pods = ceil_div(leaves, per_pod);
  if (levels == 3 && pods > r) {
    throw InputError(spec_.location_of("cluster.inter_node.switch_radix"),
                     "cluster.inter_node.switch_radix",
                     "a 3-level fat_tree of radix " + std::to_string(r) + " holds at most " +
                         std::to_string(std::int64_t{down} * per_pod * r) + " NICs, found " +
                         std::to_string(num_nics));
  }
  GraphBuilder b(vertices_, links_);
  const Seconds half = inter.latency * 0.5;
  std::vector<VertexId> leaf(leaves);
  for (int l = 0; l < leaves; ++l) leaf[l] = add_switch(1, fmt::format("leaf{}", l));
  if (inter.ecmp == EcmpMode::kSpray) {
    // ecmp spray splits every flow evenly over a switch's equal-cost uplinks, so each carries the
    // same share of the traffic: together they are exactly one link of their summed bandwidth.
    up_bw = up_bw * static_cast<double>(up);
    up = 1;
  }
  if (levels == 2) {
    std::vector<VertexId> spine(up);
    for (int s = 0; s < up; ++s) spine[s] = add_switch(2, fmt::format("spine{}", s));
    for (int l = 0; l < leaves; ++l) {
      for (int s = 0; s < up; ++s) b.add_cable(leaf[l], spine[s], up_bw, half, 2);
    }
  } else {
    // Core group j serves aggregation switch j of every pod; `cores` switches per group, enough
    // ports for every pod's uplinks. Aggregation switches are non-blocking (up = down).
    const int cores = inter.ecmp == EcmpMode::kSpray ? 1 : std::max(1, ceil_div(pods, 2));
    std::vector<VertexId> agg(static_cast<std::size_t>(pods) * up);
    for (int q = 0; q < pods; ++q) {
      for (int j = 0; j < up; ++j) {
        agg[q * up + j] = add_switch(2, fmt::format("pod{}.agg{}", q, j));
      }
    }
    std::vector<VertexId> core(static_cast<std::size_t>(up) * cores);
    for (std::size_t c = 0; c < core.size(); ++c) core[c] = add_switch(3, fmt::format("core{}", c));
    for (int l = 0; l < leaves; ++l) {
      for (int j = 0; j < up; ++j)
        b.add_cable(leaf[l], agg[(l / per_pod) * up + j], up_bw, half, 2);
    }
    // With spray, up_bw is already a leaf's summed uplinks and cores is 1: this is the pod's.
    const BytesPerSecond agg_up_bw = up_bw * (static_cast<double>(per_pod) / cores);
    for (int q = 0; q < pods; ++q) {
      for (int j = 0; j < up; ++j) {
        for (int c = 0; c < cores; ++c) {
          b.add_cable(agg[q * up + j], core[j * cores + c], agg_up_bw, half, 3);
        }
      }
    }
  }
  for (int n = 0; n < spec_.nodes; ++n) {
    for (int k = 0; k < nics_; ++k) {
      attach_nic(n, k, leaf[static_cast<int>((std::int64_t{n} * nics_ + k) / down)]);
    }
  }
}

void StructuredTopology::build_rail_optimized() {
  // Rail k: NIC k of every node, on rail switch k (several leaves per rail when the nodes do not
  // fit one switch's NIC ports). Every rail leaf has an uplink to every spine.
  int down = 0, up = 0;
  BytesPerSecond up_bw;
  leaf_ports(1, down, up, up_bw);
  if (spec_.inter.ecmp == EcmpMode::kSpray) {
    // As for fat_tree: the uplinks split every flow evenly, so they act as one summed link.
    up_bw = up_bw * static_cast<double>(up);
    up = 1;
  }
  const int per_rail = ceil_div(spec_.nodes, down);
  GraphBuilder b(vertices_, links_);
  const Seconds half = spec_.inter.latency * 0.5;
  std::vector<VertexId> leaf(static_cast<std::size_t>(nics_) * per_rail);
  for (int k = 0; k < nics_; ++k) {
    for (int x = 0; x < per_rail; ++x) {
      leaf[k * per_rail + x] =
          add_switch(1, per_rail == 1 ? fmt::format("rail{}", k) : fmt::format("rail{}.{}", k, x));
    }
  }
  std::vector<VertexId> spine(up);
  for (int s = 0; s < up; ++s) spine[s] = add_switch(2, fmt::format("spine{}", s));
  for (VertexId l : leaf) {
    for (VertexId s : spine) b.add_cable(l, s, up_bw, half, 2);
  }
  for (int n = 0; n < spec_.nodes; ++n) {
    for (int k = 0; k < nics_; ++k) attach_nic(n, k, leaf[k * per_rail + n / down]);
  }
}

void StructuredTopology::build_dragonfly() {
  const auto& inter = spec_.inter;
  const int nodes = spec_.nodes;
  int groups = inter.groups;
  if (groups == 0) groups = std::max(1, static_cast<int>(std::ceil(std::sqrt(nodes))));
  if (groups < 1 || groups > nodes) {
    throw InputError(spec_.location_of("cluster.inter_node.groups"), "cluster.inter_node.groups",
                     "found " + std::to_string(groups) + ", expected 1.." + std::to_string(nodes) +
                         " (at most one group per node)");
  }
  // Node n is in group floor(n * groups / nodes): group sizes differ by at most one.
  std::vector<int> group_first(groups + 1, nodes);
  for (int n = nodes - 1; n >= 0; --n) group_first[std::int64_t{n} * groups / nodes] = n;
  const int max_group_nodes = ceil_div(nodes, groups);
  int routers = inter.routers_per_group;
  if (routers == 0) {
    // Balanced dragonfly: a router uses a quarter of its ports for terminals.
    const int terminals = std::max(1, inter.switch_radix / 4);
    routers =
        std::clamp(ceil_div(std::int64_t{max_group_nodes} * nics_, terminals), 1, max_group_nodes);
  }
  if (routers < 1) {
    throw InputError(spec_.location_of("cluster.inter_node.routers_per_group"),
                     "cluster.inter_node.routers_per_group", "must be at least 1");
  }
  GraphBuilder b(vertices_, links_);
  const Seconds half = inter.latency * 0.5;
  std::vector<VertexId> router(static_cast<std::size_t>(groups) * routers);
  for (int q = 0; q < groups; ++q) {
    for (int x = 0; x < routers; ++x) {
      router[q * routers + x] = add_switch(1, fmt::format("g{}.r{}", q, x));
    }
  }
  for (int q = 0; q < groups; ++q) {
    for (int x = 0; x < routers; ++x) {
      for (int y = x + 1; y < routers; ++y) {
        b.add_cable(router[q * routers + x], router[q * routers + y], inter.local_bandwidth, half,
                    2);
      }
    }
  }
  // One global link per pair of groups; group q's links to the other groups are dealt out over
  // its routers in turn (the "consecutive" arrangement).
  for (int q1 = 0; q1 < groups; ++q1) {
    for (int q2 = q1 + 1; q2 < groups; ++q2) {
      b.add_cable(router[q1 * routers + (q2 - 1) % routers], router[q2 * routers + q1 % routers],
                  inter.global_bandwidth, half, 3);
    }
  }
  for (int q = 0; q < groups; ++q) {
    const int size = group_first[q + 1] - group_first[q];
    for (int l = 0; l < size; ++l) {
      const int n = group_first[q] + l;
      const VertexId r = router[q * routers + static_cast<int>(std::int64_t{l} * routers / size)];
      for (int k = 0; k < nics_; ++k) attach_nic(n, k, r);
    }
  }
}

void StructuredTopology::build_tree() {
  const auto& inter = spec_.inter;
  const auto& level_bw = inter.tree_level_bandwidth;
  const double o = inter.oversubscription;
  // Height of a subtree: a leaf switch is level 1, a switch is one above its highest child.
  std::function<int(const TreeSpec&)> height = [&](const TreeSpec& t) -> int {
    if (t.is_leaf) return 1;
    if (t.children.empty()) {
      throw InputError(spec_.location_of("cluster.inter_node.tree"), "cluster.inter_node.tree",
                       "found an empty list, expected switches or node counts");
    }
    int h = 0;
    for (const auto& c : t.children) h = std::max(h, height(c));
    return h + 1;
  };
  const int top = height(inter.tree);
  if (static_cast<int>(level_bw.size()) > top - 1) {
    throw InputError(spec_.location_of("cluster.inter_node.tree_level_bandwidth"),
                     "cluster.inter_node.tree_level_bandwidth",
                     "found " + std::to_string(level_bw.size()) + " levels, expected at most " +
                         std::to_string(top - 1) + " (one per switch level below the root)");
  }
  for (const auto& bw : level_bw) {
    if (bw.value() <= 0) {
      throw InputError(spec_.location_of("cluster.inter_node.tree_level_bandwidth"),
                       "cluster.inter_node.tree_level_bandwidth", "bandwidths must be > 0");
    }
  }
  GraphBuilder b(vertices_, links_);
  const Seconds half = inter.latency * 0.5;
  std::vector<int> per_level(top + 1, 0);
  int next_node = 0;
  struct Built {
    VertexId v;
    int level;
    BytesPerSecond below;  // capacity entering this switch from below
  };
  std::function<Built(const TreeSpec&)> make = [&](const TreeSpec& t) -> Built {
    if (t.is_leaf) {
      if (t.leaf_nodes < 1) {
        throw InputError(spec_.location_of("cluster.inter_node.tree"), "cluster.inter_node.tree",
                         "found a leaf switch with " + std::to_string(t.leaf_nodes) +
                             " nodes, expected at least 1");
      }
      const VertexId v = add_switch(1, fmt::format("tree1.{}", per_level[1]++));
      for (int x = 0; x < t.leaf_nodes; ++x, ++next_node) {
        if (next_node >= spec_.nodes) continue;  // reported below, once the total is known
        for (int k = 0; k < nics_; ++k) attach_nic(next_node, k, v);
      }
      return {v, 1, inter.nic_bandwidth * (static_cast<double>(t.leaf_nodes) * nics_)};
    }
    std::vector<Built> kids;
    for (const auto& c : t.children) kids.push_back(make(c));
    int level = 0;
    for (const auto& k : kids) level = std::max(level, k.level);
    ++level;
    const VertexId v = add_switch(level, fmt::format("tree{}.{}", level, per_level[level]++));
    BytesPerSecond below(0);
    for (const auto& k : kids) {
      // Uplink of a level-l switch: tree_level_bandwidth[l-1], else what is below it / o.
      const BytesPerSecond bw =
          k.level - 1 < static_cast<int>(level_bw.size()) ? level_bw[k.level - 1] : k.below / o;
      b.add_cable(k.v, v, bw, half, level);
      below += bw;
    }
    return {v, level, below};
  };
  make(inter.tree);
  if (next_node != spec_.nodes) {
    throw InputError(spec_.location_of("cluster.inter_node.tree"), "cluster.inter_node.tree",
                     "the tree's leaf switches hold " + std::to_string(next_node) +
                         " nodes, expected cluster.nodes = " + std::to_string(spec_.nodes));
  }
}

namespace {

/// All shortest paths (hop count, up to kMaxAlternatives) from a to b inside node 0, passing
/// only through vertices for which transit() holds.
template <typename InScope, typename Transit>
std::vector<std::vector<LinkId>> node_paths(const Graph& g, VertexId a, VertexId b,
                                            InScope in_scope, Transit transit) {
  const std::size_t n = boost::num_vertices(g);
  std::vector<int> from_a(n, -1), to_b(n, -1);
  auto bfs = [&](VertexId start, std::vector<int>& dist, bool forward) {
    std::deque<VertexId> queue{start};
    dist[start] = 0;
    while (!queue.empty()) {
      const VertexId v = queue.front();
      queue.pop_front();
      if (v != start && !transit(v)) continue;  // endpoints only, never passed through
      auto visit = [&](VertexId w) {
        if (in_scope(w) && dist[w] < 0) {
          dist[w] = dist[v] + 1;
          queue.push_back(w);
        }
      };
      if (forward) {
        for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) visit(boost::target(*e, g));
      } else {
        for (auto [e, end] = boost::in_edges(v, g); e != end; ++e) visit(boost::source(*e, g));
      }
    }
  };
  bfs(a, from_a, true);
  bfs(b, to_b, false);
  std::vector<std::vector<LinkId>> paths;
  if (from_a[b] < 0) return paths;
  const int len = from_a[b];
  std::vector<LinkId> path;
  std::function<void(VertexId)> dfs = [&](VertexId v) {
    if (paths.size() >= kMaxAlternatives) return;
    if (v == b) {
      paths.push_back(path);
      return;
    }
    if (v != a && !transit(v)) return;
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
      const VertexId w = boost::target(*e, g);
      if (in_scope(w) && to_b[w] >= 0 && from_a[v] + 1 + to_b[w] == len) {
        path.push_back(link_id(g, *e));
        dfs(w);
        path.pop_back();
      }
    }
  };
  dfs(a);
  return paths;
}

}  // namespace

void StructuredTopology::build_templates(const Graph& g) {
  const bool ring = spec_.intra.kind == IntraKind::kNvlinkRing;
  auto in_scope = [&](VertexId v) { return vertices_[v].node == 0; };
  // GPU-GPU inside a node: through NVSwitches, PCIe switches and host bridges (and GPUs on a
  // ring, which forward to their neighbour), never through a NIC.
  auto transit = [&](VertexId v) {
    const VertexKind k = vertices_[v].kind;
    return k == VertexKind::kNvswitch || k == VertexKind::kPcieSwitch ||
           k == VertexKind::kHostBridge || (ring && k == VertexKind::kGpu);
  };
  auto store = [&](const std::vector<LinkId>& path) {
    Alt a;
    a.begin = static_cast<std::uint32_t>(tmpl_.size());
    a.len = static_cast<std::uint32_t>(path.size());
    for (LinkId l : path) {
      tmpl_.push_back(l);  // node 0's links start at id 0: the id is the offset
      a.sum.add(links_[l]);
    }
    return a;
  };
  local_alt_off_.assign(static_cast<std::size_t>(m_) * m_ + 1, 0);
  for (int i = 0; i < m_; ++i) {
    for (int j = 0; j < m_; ++j) {
      local_alt_off_[i * m_ + j] = static_cast<std::uint32_t>(alts_.size());
      if (i == j) continue;
      const auto paths = node_paths(g, gpu_vertex_[i], gpu_vertex_[j], in_scope, transit);
      MOESIM_ASSERT(!paths.empty(), "GPUs of a node must be connected");
      for (const auto& p : paths) alts_.push_back(store(p));
    }
  }
  local_alt_off_.back() = static_cast<std::uint32_t>(alts_.size());
  if (nics_ == 0) return;
  // GPU <-> its NIC: the NIC is not transit either, and on a ring the direct GPU-NIC link is
  // always shortest, so GPUs need not be transit here.
  auto nic_transit = [&](VertexId v) {
    const VertexKind k = vertices_[v].kind;
    return k == VertexKind::kNvswitch || k == VertexKind::kPcieSwitch ||
           k == VertexKind::kHostBridge;
  };
  for (int i = 0; i < m_; ++i) {
    const VertexId nic = nic_vertex(0, gpu_nic_[i]);
    const auto up = node_paths(g, gpu_vertex_[i], nic, in_scope, nic_transit);
    const auto down = node_paths(g, nic, gpu_vertex_[i], in_scope, nic_transit);
    MOESIM_ASSERT(!up.empty() && !down.empty(), "every GPU must reach its NIC");
    up_.push_back(store(up.front()));
    down_.push_back(store(down.front()));
  }
}

void StructuredTopology::build_fabric_tables(const Graph& g) {
  if (nics_ == 0) return;
  const std::size_t num_switches = switch_vertex_.size();
  std::vector<std::int32_t> dest_of(num_switches, -1);
  for (std::uint32_t s : nic_switch_) {
    MOESIM_ASSERT(s < num_switches, "every NIC must be attached to a switch");
    if (dest_of[s] < 0) {
      dest_of[s] = static_cast<std::int32_t>(dest_switch_.size());
      dest_switch_.push_back(s);
    }
  }
  num_dest_ = static_cast<std::uint32_t>(dest_switch_.size());
  nic_dest_.resize(nic_switch_.size());
  for (std::size_t x = 0; x < nic_switch_.size(); ++x) nic_dest_[x] = dest_of[nic_switch_[x]];
  // d-mod-k numbering. NICs are attached node by node, so within a switch global NIC order is
  // port order; switches come in index order (leaf0, leaf1, ... / rail0, rail1, ...).
  dmodk_ = spec_.inter.ecmp == EcmpMode::kDmodk && (spec_.inter.kind == InterKind::kFatTree ||
                                                    spec_.inter.kind == InterKind::kRailOptimized);
  std::vector<std::uint32_t> first_of(num_switches + 1, 0);
  for (std::uint32_t s : nic_switch_) ++first_of[s + 1];
  for (std::size_t s = 0; s < num_switches; ++s) first_of[s + 1] += first_of[s];
  nic_order_.resize(nic_switch_.size());
  for (std::size_t x = 0; x < nic_switch_.size(); ++x) nic_order_[x] = first_of[nic_switch_[x]]++;

  auto switch_index = [&](VertexId v) -> std::int32_t {
    return vertices_[v].kind == VertexKind::kSwitch ? vertices_[v].index : -1;
  };
  // Hop distances to every destination switch over switches only: BFS backwards from each.
  const std::size_t cells = num_switches * num_dest_;
  std::vector<std::uint16_t> dist(cells, kUnreached);
  std::vector<std::vector<std::uint32_t>> by_distance(num_dest_);  // switches in BFS order
  for (std::uint32_t d = 0; d < num_dest_; ++d) {
    std::deque<std::uint32_t> queue{dest_switch_[d]};
    dist[dest_switch_[d] * num_dest_ + d] = 0;
    while (!queue.empty()) {
      const std::uint32_t s = queue.front();
      queue.pop_front();
      by_distance[d].push_back(s);
      for (auto [e, end] = boost::in_edges(switch_vertex_[s], g); e != end; ++e) {
        const std::int32_t u = switch_index(boost::source(*e, g));
        if (u >= 0 && dist[u * num_dest_ + d] == kUnreached) {
          dist[u * num_dest_ + d] = static_cast<std::uint16_t>(dist[s * num_dest_ + d] + 1);
          queue.push_back(static_cast<std::uint32_t>(u));
        }
      }
    }
  }
  cells_.assign(cells, CandidateRange{});
  std::map<std::vector<std::uint64_t>, CandidateRange> pool;
  std::vector<std::uint64_t> list;
  for (std::uint32_t s = 0; s < num_switches; ++s) {
    for (std::uint32_t d = 0; d < num_dest_; ++d) {
      const std::size_t cell = static_cast<std::size_t>(s) * num_dest_ + d;
      if (dist[cell] == kUnreached || dist[cell] == 0) continue;
      list.clear();
      for (auto [e, end] = boost::out_edges(switch_vertex_[s], g); e != end; ++e) {
        const std::int32_t w = switch_index(boost::target(*e, g));
        if (w >= 0 && dist[w * num_dest_ + d] + 1 == dist[cell]) {
          list.push_back(std::uint64_t{link_id(g, *e)} << 32 | static_cast<std::uint32_t>(w));
        }
      }
      auto [it, fresh] = pool.try_emplace(list);
      if (fresh) {
        it->second = {static_cast<std::uint32_t>(cand_.size()),
                      static_cast<std::uint32_t>(list.size())};
        for (std::uint64_t c : list) {
          cand_.push_back(
              Candidate{static_cast<LinkId>(c >> 32), static_cast<std::uint32_t>(c & 0xFFFFFFFFu)});
        }
      }
      cells_[cell] = it->second;
    }
  }
  for (std::uint32_t x = 0; x < nic_switch_.size(); ++x) {
    for (std::uint32_t d = 0; d < num_dest_; ++d) {
      MOESIM_ASSERT(dist[nic_switch_[x] * num_dest_ + d] != kUnreached,
                    "the fabric must connect every pair of NIC switches");
    }
  }
  // Path summaries towards each destination, nearest switches first. A cell is uniform when all
  // its equal-cost choices give the same summary: then the ECMP choice cannot change pair_cost.
  fabric_sum_.assign(cells, FabricSummary{});
  for (std::uint32_t d = 0; d < num_dest_; ++d) {
    for (std::uint32_t s : by_distance[d]) {
      const std::size_t cell = static_cast<std::size_t>(s) * num_dest_ + d;
      FabricSummary& f = fabric_sum_[cell];
      if (dist[cell] == 0) {
        f.uniform = true;
        continue;
      }
      const CandidateRange range = cells_[cell];
      for (std::uint32_t c = range.first; c < range.first + range.count; ++c) {
        const FabricSummary& next = fabric_sum_[cand_[c].next * num_dest_ + d];
        PathSummary p;
        p.add(links_[cand_[c].link]);
        p.add(next.sum);
        if (c == range.first) {
          f.sum = p;
          f.uniform = next.uniform;
        } else {
          f.uniform = f.uniform && next.uniform && p == f.sum;
        }
      }
    }
  }
}

void StructuredTopology::route(int src, int dst, std::vector<LinkId>& out) const {
  const int n1 = src / m_, n2 = dst / m_;
  if (n1 == n2) {
    if (src != dst) append(local_alt(src, dst), n1, out);
    return;
  }
  const int i = src % m_, j = dst % m_;
  const std::size_t g1 = static_cast<std::size_t>(n1) * nics_ + gpu_nic_[i];
  const std::size_t g2 = static_cast<std::size_t>(n2) * nics_ + gpu_nic_[j];
  append(up_[i], n1, out);
  out.push_back(nic_up_[g1]);
  walk_fabric(src, dst, g2, nic_switch_[g1], [&](LinkId l) { out.push_back(l); });
  out.push_back(nic_down_[g2]);
  append(down_[j], n2, out);
}

PathSummary StructuredTopology::inter_summary(int src, int dst, int n1, int n2) const {
  const int i = src % m_, j = dst % m_;
  const std::size_t g1 = static_cast<std::size_t>(n1) * nics_ + gpu_nic_[i];
  const std::size_t g2 = static_cast<std::size_t>(n2) * nics_ + gpu_nic_[j];
  PathSummary p = up_[i].sum;
  p.add(links_[nic_up_[g1]]);
  const std::uint32_t s = nic_switch_[g1], d = nic_dest_[g2];
  const FabricSummary& f = fabric_sum_[static_cast<std::size_t>(s) * num_dest_ + d];
  if (f.uniform) {
    p.add(f.sum);
  } else {
    walk_fabric(src, dst, g2, s, [&](LinkId l) { p.add(links_[l]); });
  }
  p.add(links_[nic_down_[g2]]);
  p.add(down_[j].sum);
  p.bandwidth =
      std::min({p.bandwidth, nic_share_bandwidth_[src].value(), nic_share_bandwidth_[dst].value()});
  p.tier = std::max(p.tier, 1);
  return p;
}

PathSummary StructuredTopology::summary(int src, int dst) const {
  const int n1 = src / m_, n2 = dst / m_;
  if (n1 == n2) {
    PathSummary p = local_alt(src, dst).sum;
    p.tier = 0;
    return p;
  }
  return inter_summary(src, dst, n1, n2);
}

PairCost StructuredTopology::compute_pair_cost(int src, int dst) const {
  const PathSummary p = summary(src, dst);
  return PairCost{Seconds(p.alpha_s), BytesPerSecond(p.bandwidth), p.hops, p.tier};
}

std::vector<TierRow> StructuredTopology::compute_tier_table() const {
  TierAccumulator acc;
  auto cost = [](const PathSummary& p) {
    return PairCost{Seconds(p.alpha_s), BytesPerSecond(p.bandwidth), p.hops, p.tier};
  };
  // Intra-node pairs: node n's pair (i, j) mirrors node 0's except for the ECMP choice between
  // alternatives, so only pairs with one alternative can be counted once for all nodes.
  for (int i = 0; i < m_; ++i) {
    for (int j = 0; j < m_; ++j) {
      if (i == j) continue;
      const std::uint32_t n_alt = local_alt_off_[i * m_ + j + 1] - local_alt_off_[i * m_ + j];
      if (n_alt == 1) {
        acc.add(cost(summary(i, j)), spec_.nodes);
      } else {
        for (int n = 0; n < spec_.nodes; ++n) acc.add(cost(summary(n * m_ + i, n * m_ + j)));
      }
    }
  }
  if (nics_ == 0) return acc.rows();
  // Inter-node pairs: with uniform fabric cells, a pair's summary depends only on the local GPUs
  // and on which switches the two nodes' NICs hang off. Nodes with the same NIC switches form a
  // class (e.g. all nodes under one leaf), and each class pair is summarised once, weighted by
  // its number of node pairs. Inside a node, GPUs whose half of the path has the same figures
  // (their up-path and NIC link, the NIC's switch or destination cell, their NIC share) give the
  // same summary with any partner, so each class pair costs (source groups x destination groups)
  // summaries, not m^2: a 72-GPU NVL72 rack's NICs on 3 leaves make 3 groups.
  std::map<std::vector<std::uint32_t>, int> class_index;
  std::vector<std::vector<int>> members;
  for (int n = 0; n < spec_.nodes; ++n) {
    std::vector<std::uint32_t> key(
        nic_switch_.begin() + static_cast<std::ptrdiff_t>(n) * nics_,
        nic_switch_.begin() + static_cast<std::ptrdiff_t>(n + 1) * nics_);
    auto [it, fresh] = class_index.emplace(std::move(key), static_cast<int>(members.size()));
    if (fresh) members.emplace_back();
    members[it->second].push_back(n);
  }
  // One half of a path: what inter_summary reads for a GPU on that side (exact values, so a
  // group's members are interchangeable bit for bit).
  using Half = std::tuple<double, double, int, int, double, double, int, std::uint32_t, double>;
  auto half = [&](const Alt& a, LinkId nic_link, std::uint32_t cell, int gpu) {
    const PathSummary& u = a.sum;
    const Link& l = links_[nic_link];
    return Half{u.alpha_s,
                u.bandwidth,
                u.hops,
                u.tier,
                l.latency.value(),
                l.bandwidth.value(),
                l.tier,
                cell,
                nic_share_bandwidth_[gpu].value()};
  };
  struct Group {
    int gpu = 0;  // a local GPU of the group
    std::int64_t count = 0;
  };
  auto groups_of = [&](int n, bool source) {
    std::map<Half, Group> g;
    for (int i = 0; i < m_; ++i) {
      const std::size_t k = static_cast<std::size_t>(n) * nics_ + gpu_nic_[i];
      const Half h = source ? half(up_[i], nic_up_[k], nic_switch_[k], n * m_ + i)
                            : half(down_[i], nic_down_[k], nic_dest_[k], n * m_ + i);
      Group& e = g.try_emplace(h, Group{i, 0}).first->second;
      ++e.count;
    }
    std::vector<Group> out;
    for (const auto& [h, e] : g) out.push_back(e);
    return out;
  };
  auto distinct = [&](int n, const std::vector<std::uint32_t>& of) {
    std::vector<std::uint32_t> v(of.begin() + static_cast<std::ptrdiff_t>(n) * nics_,
                                 of.begin() + static_cast<std::ptrdiff_t>(n + 1) * nics_);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  std::vector<std::vector<Group>> src_groups, dst_groups;
  std::vector<std::vector<std::uint32_t>> switches, dests;
  for (const auto& a : members) {
    src_groups.push_back(groups_of(a.front(), true));
    dst_groups.push_back(groups_of(a.front(), false));
    switches.push_back(distinct(a.front(), nic_switch_));
    dests.push_back(distinct(a.front(), nic_dest_));
  }
  for (std::size_t ca = 0; ca < members.size(); ++ca) {
    const auto& a = members[ca];
    for (std::size_t cb = 0; cb < members.size(); ++cb) {
      const auto& b = members[cb];
      const int n1 = a.front(), n2 = b.front();
      bool uniform = true;
      for (std::uint32_t sw : switches[ca])
        for (std::uint32_t d : dests[cb])
          uniform = uniform && fabric_sum_[static_cast<std::size_t>(sw) * num_dest_ + d].uniform;
      if (uniform) {
        const std::int64_t node_pairs = static_cast<std::int64_t>(a.size()) * b.size() -
                                        (&a == &b ? static_cast<std::int64_t>(a.size()) : 0);
        if (node_pairs == 0) continue;
        for (const Group& gs : src_groups[ca])
          for (const Group& gd : dst_groups[cb])
            acc.add(cost(inter_summary(n1 * m_ + gs.gpu, n2 * m_ + gd.gpu, n1, n2)),
                    node_pairs * gs.count * gd.count);
        continue;
      }
      for (int x : a) {  // ECMP may pick paths with different summaries: every pair on its own
        for (int y : b) {
          if (x == y) continue;
          for (int i = 0; i < m_; ++i) {
            for (int j = 0; j < m_; ++j) acc.add(cost(inter_summary(x * m_ + i, y * m_ + j, x, y)));
          }
        }
      }
    }
  }
  return acc.rows();
}

}  // namespace

std::unique_ptr<Topology> build_structured(const ClusterSpec& spec) {
  return std::make_unique<StructuredTopology>(spec);
}

}  // namespace moesim::topology::detail
