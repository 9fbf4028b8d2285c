// 2DH (two-dimensional hierarchical) all-to-all (Tutel §3.4, Alg. 1; docs/strategy-specs.md §2).
// For a node-aligned group of n nodes x m ranks: stride copy, intra-node all-to-all of n-chunk
// blocks, stride copy, inter-node all-to-all of m-chunk blocks between same-local-index ranks. Each
// rank sends (m-1) + (n-1) messages instead of W-1, at the price of two full-buffer copies and more
// intra-node bytes; it wins when S/W is small. The buffer layout is in collective.hpp.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class TwoDhAllToAll final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAll; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::k2dh; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology& topo) const override {
    const auto info = grid_info(*call.group, topo);
    return info->grid ? "" : "2dh all_to_all needs a node-aligned group: " + info->why;
  }

  std::vector<Phase> lower(const CollectiveCall& call,
                           const topology::Topology& topo) const override {
    const NodeGrid grid = require_grid(call, topo, "2dh all_to_all");
    const int m = grid.m, n = grid.n;
    // One node or one rank per node: both hierarchical phases collapse into one, i.e. linear.
    if (m == 1 || n == 1) return linear_all_to_all().lower(call, topo);
    const std::vector<int>& g = *call.group;
    const int w = m * n;
    const double size = call.spec->bytes.value();
    if (size <= 0) return {};
    // Both levels are one exchange along a grid dimension (intra: the node's m ranks, stride 1;
    // inter: the n ranks of one local index, stride m), each after its stride copy
    // (fill_level_exchange).
    std::vector<Phase> phases = two_dh_phases();
    fill_level_exchange(phases[kStrideCopy1], phases[kIntra], g, m, 1, size / w, call.with_layout);
    fill_level_exchange(phases[kStrideCopy2], phases[kInter], g, n, m, size / w, call.with_layout);
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    const NodeGrid grid = require_grid(call, *ctx.topo, "2dh all_to_all");
    const int m = grid.m, n = grid.n;
    if (m == 1 || n == 1) return linear_all_to_all().analytical_time(call, ctx);
    const double size = call.spec->bytes.value();
    if (size <= 0) return Seconds(0);
    const auto prof = two_dh_profile(call, *ctx.topo, grid);
    const double bw = copy_bandwidth(ctx);
    const auto local = [bw](double bytes) { return bw > 0 ? bytes / bw : 0.0; };
    // Per representative rank: intra messages carry S/m bytes each, inter messages S/n.
    double intra = 0, inter = 0;
    for (size_t i = 0; i < prof->intra.size(); ++i) {
      const ClassStats& a = prof->intra[i];
      const ClassStats& r = prof->rail[i];
      intra = std::max(intra, ctx.net.message_latency_s + (m - 1) * ctx.net.overhead_s(m - 1) +
                                  a.max_alpha_s + size / m * a.sum_inv_bw);
      inter = std::max(inter, ctx.net.message_latency_s + (n - 1) * ctx.net.overhead_s(n - 1) +
                                  r.max_alpha_s + size / n * r.sum_inv_bw);
    }
    // The inter-node phase moves every byte that leaves a node, as the linear algorithm does, so
    // it carries the same fabric cut bound (oversubscribed leaf / pod / group uplinks).
    // Its messages are n-1 per rank of S/n bytes each instead of W-1 of S/W: the same bytes in
    // m times fewer messages, so a crossing message carries m chunks and one overhead.
    const UniformCut& cut = uniform_exchange_cut(call, *ctx.topo);
    if (cut.s_per_byte > 0) {
      inter = std::max(inter, ctx.net.message_latency_s + prof->rail_max.max_alpha_s +
                                  cut.seconds(size / (m * n), ctx.net.overhead_s(n - 1) / m));
    }
    intra = std::max(intra, local(2 * size / m));
    inter = std::max(inter, local(2 * size / n));
    return Seconds(2 * local(2 * size) + intra + inter);
  }
};

}  // namespace

const Algorithm& two_dh_all_to_all() {
  static const TwoDhAllToAll algo;
  return algo;
}

}  // namespace moesim::collectives::detail
