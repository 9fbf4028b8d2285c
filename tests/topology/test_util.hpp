// Shared helpers for the topology tests: ClusterSpecs built in code (no YAML loader).
#pragma once

#include <set>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/units.hpp"
#include "topology/topology.hpp"

namespace moesim::topology::testing {

using namespace moesim::literals;

/// a100-sxm-80gb (PCIe 32 GB/s per direction) nodes; NVSwitch 300 GB/s, 1 us; NICs 200 Gb/s
/// (25 GB/s), one per GPU, 2 us.
inline ClusterSpec make_spec(int nodes, int gpus_per_node, IntraKind intra, InterKind inter) {
  ClusterSpec s;
  s.gpu.name = "a100-sxm-80gb";
  s.gpu.from_catalog = true;
  s.nodes = nodes;
  s.gpus_per_node = gpus_per_node;
  s.intra.kind = intra;
  s.intra.bandwidth = 300_GBps;
  s.intra.efficiency = 1.0;  // spec-sheet rates: the tests' hand-worked link bandwidths
  s.intra.latency = 1_us;
  s.inter.kind = inter;
  s.inter.nic_bandwidth = 200_Gbps;
  s.inter.nic_efficiency = 1.0;
  s.inter.nics_per_node = gpus_per_node;
  s.inter.latency = 2_us;
  return s;
}

inline constexpr double kGB = 1e9;
inline constexpr double kUs = 1e-6;

/// Directed route as a vector.
inline std::vector<LinkId> route_of(const Topology& t, int src, int dst) {
  std::vector<LinkId> out;
  t.route(src, dst, out);
  return out;
}

/// Counts vertices of one kind.
inline int count_kind(const Topology& t, VertexKind k) {
  int n = 0;
  for (const auto& v : t.vertices()) n += v.kind == k;
  return n;
}

/// Fabric switches a route passes through.
inline std::vector<VertexId> switches_on(const Topology& t, const std::vector<LinkId>& path) {
  std::vector<VertexId> out;
  for (LinkId l : path) {
    const VertexId v = t.links()[l].dst;
    if (t.vertices()[v].kind == VertexKind::kSwitch) out.push_back(v);
  }
  return out;
}

}  // namespace moesim::topology::testing
