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
    const auto info = grid_info(*call.group, topo);
    if (!info->grid)
      throw InputError("hierarchical all_reduce needs a node-aligned group: " + info->why);
    const auto grid = info->grid;
    const std::vector<int>& g = *call.group;
    const int m = grid->m, n = grid->n;
    const double size = call.spec->bytes.value();
    if (m * n < 2 || size <= 0) return {};
    const bool layout = call.with_layout;
    std::vector<std::vector<int>> nodes(n), rails(m);
    for (int a = 0; a < n; ++a)
      for (int j = 0; j < m; ++j) {
        nodes[a].push_back(g[a * m + j]);
        rails[j].push_back(g[a * m + j]);
      }
    std::vector<Phase> phases;
    auto ring_phase = [&](std::string_view label, int repeat) -> Phase& {
      Phase& ph = phases.emplace_back();
      ph.kind = Phase::Kind::kTransfers;
      ph.label = label;
      ph.src = ph.dst = Buffer::kRecv;
      ph.repeat = repeat;
      return ph;
    };
    auto reduce_phase = [&](std::string_view label, double bytes) {
      Phase& ph = phases.emplace_back();
      ph.kind = Phase::Kind::kReduce;
      ph.label = label;
      ph.src = ph.dst = Buffer::kRecv;
      ph.local_bytes = Bytes(bytes);
    };
    const double c_node = size / m;        // chunk of the intra-node rings
    const double c_rail = size / (m * n);  // sub-chunk of the inter-node rings
    if (m > 1) {
      Phase& rs = ring_phase("intra_rs_step", m - 1);
      for (const auto& ring : nodes) append_ring_step(rs, ring, c_node, -1, 0.0, layout);
      reduce_phase("intra_rs_reduce", 3 * c_node * (m - 1));
    }
    if (n > 1) {
      Phase& rs = ring_phase("inter_rs_step", n - 1);
      for (int j = 0; j < m; ++j) append_ring_step(rs, rails[j], c_rail, -1, j * c_node, layout);
      reduce_phase("inter_rs_reduce", 3 * c_rail * (n - 1));
      Phase& ag = ring_phase("inter_ag_step", n - 1);
      for (int j = 0; j < m; ++j) append_ring_step(ag, rails[j], c_rail, 0, j * c_node, layout);
    }
    if (m > 1) {
      Phase& ag = ring_phase("intra_ag_step", m - 1);
      for (const auto& ring : nodes) append_ring_step(ag, ring, c_node, 0, 0.0, layout);
    }
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    const auto shape = scaled_shape(*this, call, *ctx.topo, kTagHierAllReduce, 0);
    return Seconds(shape_time_s(*shape, call.spec->bytes.value(), ctx));
  }
};

}  // namespace

const Algorithm& hierarchical_all_reduce() {
  static const HierarchicalAllReduce algo;
  return algo;
}

}  // namespace moesim::collectives::detail
