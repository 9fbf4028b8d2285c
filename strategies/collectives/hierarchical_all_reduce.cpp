// Hierarchical all_reduce on a node-aligned group (n nodes x m ranks, position p = a*m + j):
//   1. intra-node ring reduce-scatter (chunks of S/m): (a, j) ends owning reduced chunk j;
//   2. inter-node ring all_reduce of that chunk among the n ranks with local index j (rails),
//      in sub-chunks of S/(m*n) at base offset j*S/m;
//   3. intra-node ring all_gather of the m chunks.
// Only S/m bytes per rank cross the network (vs 2S(W-1)/W for a flat ring over nodes), and the
// inter-node rings run in parallel on all rails. m = 1 or n = 1 drops the empty levels.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class HierarchicalAllReduce final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllReduce; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kHierarchical; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology& topo) const override {
    const auto info = grid_info(*call.group, topo);
    return info->grid ? "" : "hierarchical all_reduce needs a node-aligned group: " + info->why;
  }

  std::vector<Phase> lower(const CollectiveCall& call,
                           const topology::Topology& topo) const override {
    const NodeGrid grid = require_grid(call, topo, "hierarchical all_reduce");
    const std::vector<int>& g = *call.group;
    const int m = grid.m, n = grid.n;
    const double size = call.spec->bytes.value();
    if (m * n < 2 || size <= 0) return {};
    const bool layout = call.with_layout;
    std::vector<std::vector<int>> nodes(n), rails(m);
    for (int a = 0; a < n; ++a)
      for (int j = 0; j < m; ++j) {
        nodes[a].push_back(g[a * m + j]);
        rails[j].push_back(g[a * m + j]);
      }
    const double c_node = size / m;        // chunk of the intra-node rings
    const double c_rail = size / (m * n);  // sub-chunk of the inter-node rings, at base j * c_node
    // Levels with one rank per ring (m = 1 or n = 1) append nothing.
    std::vector<Phase> phases;
    append_ring_reduce_scatter(phases, nodes, c_node, 0.0, kIntraNodeRings, layout);
    append_ring_reduce_scatter(phases, rails, c_rail, c_node, kInterNodeRings, layout);
    append_ring_all_gather(phases, rails, c_rail, c_node, kInterNodeRings, layout);
    append_ring_all_gather(phases, nodes, c_node, 0.0, kIntraNodeRings, layout);
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagHierAllReduce, 0);
  }
};

}  // namespace

const Algorithm& hierarchical_all_reduce() {
  static const HierarchicalAllReduce algo;
  return algo;
}

}  // namespace moesim::collectives::detail
