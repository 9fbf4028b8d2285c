#include "topology/topology.hpp"

#include <atomic>
#include <boost/graph/push_relabel_max_flow.hpp>
#include <cmath>
#include <ostream>

#include "core/error.hpp"
#include "topology/detail.hpp"
#include "topology/gpu_catalog.hpp"
#include "topology/nic_catalog.hpp"

namespace moesim::topology {

std::string_view vertex_kind_name(VertexKind k) {
  switch (k) {
    case VertexKind::kGpu:
      return "gpu";
    case VertexKind::kNvswitch:
      return "nvswitch";
    case VertexKind::kPcieSwitch:
      return "pcie_switch";
    case VertexKind::kHostBridge:
      return "host_bridge";
    case VertexKind::kNic:
      return "nic";
    case VertexKind::kSwitch:
      return "switch";
  }
  return "unknown";
}

namespace detail {

Graph make_graph(std::size_t num_vertices, const std::vector<Link>& links) {
  Graph g(num_vertices);
  for (LinkId id = 0; id < links.size(); ++id) boost::add_edge(links[id].src, links[id].dst, id, g);
  return g;
}

VertexId GraphBuilder::add_vertex(VertexKind kind, int node, int index, int level,
                                  std::string name) {
  vertices_.push_back(Vertex{kind, node, index, level, std::move(name)});
  return static_cast<VertexId>(vertices_.size() - 1);
}

LinkId GraphBuilder::add_cable(VertexId a, VertexId b, BytesPerSecond bandwidth, Seconds latency,
                               int tier) {
  MOESIM_ASSERT(a != b && a < vertices_.size() && b < vertices_.size(), "bad cable endpoints");
  const auto id = static_cast<LinkId>(links_.size());
  links_.push_back(Link{a, b, bandwidth, latency, tier});
  links_.push_back(Link{b, a, bandwidth, latency, tier});
  return id;
}

}  // namespace detail

PairCost Topology::pair_cost(int src, int dst) const {
  MOESIM_ASSERT(src >= 0 && src < num_gpus() && dst >= 0 && dst < num_gpus(),
                "pair_cost: GPU rank out of range");
  if (src == dst) return PairCost{Seconds(0), BytesPerSecond(gpu().hbm_bandwidth), 0, 0};
  return compute_pair_cost(src, dst);
}

std::uint64_t Topology::next_instance_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

PairCost Topology::compute_pair_cost(int src, int dst) const {
  // Reused per thread: pair_cost is called for every pair by TA-MoE and the analytical model.
  thread_local std::vector<LinkId> path;
  path.clear();
  route(src, dst, path);
  detail::PathSummary s;
  for (LinkId l : path) s.add(links_[l]);
  if (node_of(src) != node_of(dst)) {
    for (int g : {src, dst}) {
      const double share = nic_share_bandwidth(g).value();
      if (share > 0) s.bandwidth = std::min(s.bandwidth, share);
    }
    s.tier = std::max(s.tier, 1);
  } else {
    s.tier = 0;
  }
  return PairCost{Seconds(s.alpha_s), BytesPerSecond(s.bandwidth), s.hops, s.tier};
}

std::vector<TierRow> Topology::tier_table() const { return compute_tier_table(); }

std::vector<TierRow> Topology::compute_tier_table() const {
  detail::TierAccumulator acc;
  const int p = num_gpus();
  for (int s = 0; s < p; ++s) {
    for (int d = 0; d < p; ++d) {
      if (s != d) acc.add(compute_pair_cost(s, d));
    }
  }
  return acc.rows();
}

BytesPerSecond Topology::bisection_bandwidth() const {
  const int p = num_gpus();
  if (p < 2) return BytesPerSecond(0);
  // Integer capacities in B/s: push-relabel is exact on integers, and rounding a link to the
  // nearest byte per second is far below any figure we report.
  using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
  using FlowGraph = boost::adjacency_list<
      boost::vecS, boost::vecS, boost::directedS, boost::no_property,
      boost::property<
          boost::edge_capacity_t, std::int64_t,
          boost::property<boost::edge_residual_capacity_t, std::int64_t,
                          boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;
  const auto n = vertices_.size();
  FlowGraph g(n + 2);
  auto cap = boost::get(boost::edge_capacity, g);
  auto rev = boost::get(boost::edge_reverse, g);
  auto add = [&](std::size_t u, std::size_t v, std::int64_t c) {
    auto e = boost::add_edge(u, v, g).first;
    auto r = boost::add_edge(v, u, g).first;
    cap[e] = c;
    cap[r] = 0;
    rev[e] = r;
    rev[r] = e;
  };
  std::int64_t total = 1;
  for (const Link& l : links_) {
    const auto c = static_cast<std::int64_t>(std::llround(l.bandwidth.value()));
    add(l.src, l.dst, c);
    total += c;
  }
  const std::size_t source = n, sink = n + 1;
  // "Infinite" super-source/sink edges: more than every link together, so they never bind.
  for (int gpu = 0; gpu < p; ++gpu) {
    if (gpu < p / 2) {
      add(source, gpu_vertex_[gpu], total);
    } else {
      add(gpu_vertex_[gpu], sink, total);
    }
  }
  const std::int64_t flow = boost::push_relabel_max_flow(g, source, sink);
  return BytesPerSecond(static_cast<double>(flow));
}

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void apply_defaults(ClusterSpec& spec) {
  resolve_gpu(spec.gpu);
  if (spec.nodes < 1)
    throw InputError(spec.location_of("cluster.nodes"), "cluster.nodes", "must be at least 1");
  if (spec.gpus_per_node < 1)
    throw InputError(spec.location_of("cluster.gpus_per_node"), "cluster.gpus_per_node",
                     "must be at least 1");
  auto& intra = spec.intra;
  if (intra.bandwidth.value() <= 0) {
    // Unset: the GPU's own link (NVLink per direction, or its PCIe slot).
    intra.bandwidth =
        intra.kind == IntraKind::kPcie ? spec.gpu.pcie_bandwidth : spec.gpu.nvlink_bandwidth;
  }
  // Spec-sheet rate -> what transfers achieve (idempotent: a resolved spec keeps its nominal).
  if (intra.nominal_bandwidth.value() <= 0) intra.nominal_bandwidth = intra.bandwidth;
  if (intra.efficiency <= 0) intra.efficiency = default_intra_efficiency(intra.kind);
  intra.bandwidth = BytesPerSecond(intra.nominal_bandwidth.value() * intra.efficiency);
  if (intra.bandwidth.value() <= 0 && spec.gpus_per_node > 1 &&
      spec.inter.kind != InterKind::kCustom) {
    throw InputError(spec.location_of("cluster.intra_node.bandwidth"),
                     "cluster.intra_node.bandwidth",
                     "found no bandwidth (GPU '" + spec.gpu.name + "' has no " +
                         (intra.kind == IntraKind::kPcie ? "PCIe" : "NVLink") +
                         " figure), expected a rate such as 300GB/s");
  }
  if (intra.latency.value() < 0) {
    throw InputError(spec.location_of("cluster.intra_node.latency"), "cluster.intra_node.latency",
                     "must not be negative");
  }
  if (intra.kind == IntraKind::kPcie) {
    if (intra.gpus_per_pcie_switch < 1) {
      throw InputError(spec.location_of("cluster.intra_node.gpus_per_pcie_switch"),
                       "cluster.intra_node.gpus_per_pcie_switch", "must be at least 1");
    }
    if (intra.sockets < 1)
      throw InputError(spec.location_of("cluster.intra_node.sockets"), "cluster.intra_node.sockets",
                       "must be >= 1");
    if (intra.socket_link_bandwidth.value() <= 0) intra.socket_link_bandwidth = intra.bandwidth;
  }
  auto& inter = spec.inter;
  if (inter.kind == InterKind::kNone && spec.nodes > 1) {
    throw InputError(spec.location_of("cluster.inter_node.kind"), "cluster.inter_node.kind",
                     "found none with " + std::to_string(spec.nodes) +
                         " nodes, expected switch, fat_tree, rail_optimized, dragonfly, tree or "
                         "custom");
  }
  if (inter.kind != InterKind::kNone && inter.kind != InterKind::kCustom) {
    if (inter.nics_per_node < 1) {
      throw InputError(spec.location_of("cluster.inter_node.nics_per_node"),
                       "cluster.inter_node.nics_per_node", "must be at least 1");
    }
    const NicModel* nic = cluster_nic(spec);
    if (inter.nic_bandwidth.value() <= 0 && nic != nullptr) inter.nic_bandwidth = nic->line_rate;
    if (inter.nic_bandwidth.value() <= 0) {
      throw InputError(spec.location_of("cluster.inter_node.nic_bandwidth"),
                       "cluster.inter_node.nic_bandwidth",
                       "found no bandwidth (GPU '" + spec.gpu.name +
                           "' has no catalog NIC), expected a rate such as 200Gb/s or "
                           "inter_node.nic naming one of " +
                           join_names(nic_names()));
    }
    if (inter.latency.value() < 0) {
      throw InputError(spec.location_of("cluster.inter_node.latency"), "cluster.inter_node.latency",
                       "must not be negative");
    }
    if (!(inter.oversubscription > 0)) {
      throw InputError(spec.location_of("cluster.inter_node.oversubscription"),
                       "cluster.inter_node.oversubscription", "must be > 0");
    }
    if (inter.switch_radix < 2) {
      throw InputError(spec.location_of("cluster.inter_node.switch_radix"),
                       "cluster.inter_node.switch_radix", "must be at least 2");
    }
    if (inter.nominal_nic_bandwidth.value() <= 0) inter.nominal_nic_bandwidth = inter.nic_bandwidth;
    if (inter.nic_efficiency <= 0)
      inter.nic_efficiency = nic != nullptr ? nic->efficiency : kNicEfficiency;
    inter.nic_bandwidth =
        BytesPerSecond(inter.nominal_nic_bandwidth.value() * inter.nic_efficiency);
    if (inter.local_bandwidth.value() <= 0) inter.local_bandwidth = inter.nic_bandwidth;
    if (inter.global_bandwidth.value() <= 0) inter.global_bandwidth = inter.nic_bandwidth;
  }
  if (inter.kind == InterKind::kCustom && !spec.custom) {
    throw InputError(spec.location_of("cluster.custom"), "cluster.custom",
                     "inter_node.kind is custom but no custom topology");
  }
}

}  // namespace

std::unique_ptr<Topology> build_topology(const ClusterSpec& spec) {
  ClusterSpec resolved = spec;
  apply_defaults(resolved);
  if (resolved.inter.kind == InterKind::kCustom) return detail::build_custom(resolved);
  return detail::build_structured(resolved);
}

void write_dot(const Topology& topo, std::ostream& os) {
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  auto style = [](VertexKind k) -> const char* {
    switch (k) {
      case VertexKind::kGpu:
        return "shape=box, style=filled, fillcolor=palegreen";
      case VertexKind::kNvswitch:
        return "shape=hexagon, style=filled, fillcolor=gold";
      case VertexKind::kPcieSwitch:
        return "shape=diamond, style=filled, fillcolor=lightgrey";
      case VertexKind::kHostBridge:
        return "shape=octagon, style=filled, fillcolor=lightpink";
      case VertexKind::kNic:
        return "shape=ellipse, style=filled, fillcolor=lightblue";
      case VertexKind::kSwitch:
        return "shape=doublecircle, style=filled, fillcolor=orange";
    }
    return "";
  };
  os << "graph moesim {\n  graph [overlap=false];\n";
  for (const Vertex& v : topo.vertices()) {
    os << "  " << quoted(v.name) << " [" << style(v.kind) << ", label=" << quoted(v.name) << "];\n";
  }
  const auto& links = topo.links();
  for (std::size_t c = 0; c + 1 < links.size(); c += 2) {
    const Link& l = links[c];
    os << "  " << quoted(topo.vertices()[l.src].name) << " -- "
       << quoted(topo.vertices()[l.dst].name)
       << " [label=" << quoted(to_string(l.bandwidth) + ", " + to_string(l.latency)) << "];\n";
  }
  os << "}\n";
}

}  // namespace moesim::topology
