// DeepEP-style all_to_allv (DeepSeek-V3's dispatch; STRATEGIES, "deepep"): tokens deduplicated
// per node and per GPU. A node-aligned group of n nodes x m GPUs, position p = a*m + j.
//
// Dispatch (CollectiveSpec::dedup_combine false), two sets of transfers:
//   inter  (a, j) -> (b, j) for b != a: the tokens of (a, j) with an expert on node b, once
//          each (NodeDedup::node_tokens), over the fabric to the GPU on the same rail;
//   intra  (b, j) -> (b, k) for k != j: every token (b, j) forwards or owns with an expert on
//          (b, k), once each: sum over source nodes a of gpu_tokens[(a, j)][(b, k)] (a = b: its
//          own tokens, sent straight over NVLink).
// Combine (dedup_combine true): the same transfers reversed (the expert outputs of a token are
// gathered, and reduced, on the GPU that forwarded it, then go back once per node).
//
// DeepEP's kernels pipeline the two: the forwarding GPU sends each chunk on over NVLink as it
// arrives over RDMA (the combine likewise reduces and sends on chunk by chunk). So both sets are
// one phase here, and a collective takes about the longer of the two, as DeepEP's does. Not
// charged: the first chunk's wait before forwarding starts, and the local copies into and out of
// the forwarding buffers. No chunk layout (exec/ does not run this algorithm; `moesim exec`
// refuses it).
#include <fmt/format.h>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

const NodeDedup& require_dedup(const CollectiveCall& call, NodeGrid grid) {
  const auto& all = call.spec->node_dedup;
  const std::size_t i = all.size() == 1 ? 0 : static_cast<std::size_t>(call.group_index);
  if (i >= all.size() || !all[i])
    throw InputError(
        "deepep all_to_allv needs the dispatch's per-node token counts (CollectiveSpec::"
        "node_dedup), which only a routed MoE dispatch with a2a: deepep carries");
  const NodeDedup& d = *all[i];
  const int w = grid.m * grid.n;
  if (d.size != w || d.nodes != grid.n || d.gpu_tokens.size() != static_cast<std::size_t>(w) * w ||
      d.node_tokens.size() != static_cast<std::size_t>(w) * grid.n)
    throw InputError(fmt::format(
        "deepep all_to_allv: the token counts are for {} positions on {} nodes, the group has {} "
        "on {}",
        d.size, d.nodes, w, grid.n));
  return d;
}

class DeepepAllToAllv final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAllv; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kDeepep; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology& topo) const override {
    if (call.spec->node_dedup.empty())
      return "deepep needs the per-node token counts of a routed MoE dispatch (a2a: deepep)";
    const auto info = grid_info(*call.group, topo);
    return info->grid ? "" : "deepep all_to_allv needs a node-aligned group: " + info->why;
  }

  std::vector<Phase> lower(const CollectiveCall& call,
                           const topology::Topology& topo) const override {
    const NodeGrid grid = require_grid(call, topo, "deepep all_to_allv");
    const NodeDedup& d = require_dedup(call, grid);
    const std::vector<int>& g = *call.group;
    const int m = grid.m, n = grid.n, w = m * n;
    const double unit = d.unit.value();
    Phase ph;
    ph.kind = Phase::Kind::kTransfers;
    ph.label = call.spec->dedup_combine ? "combine" : "dispatch";
    const bool combine = call.spec->dedup_combine;
    auto add = [&](int from, int to, double bytes) {
      if (bytes <= 0) return;
      if (combine)
        ph.transfers.push_back(
            {g[static_cast<std::size_t>(to)], g[static_cast<std::size_t>(from)], bytes});
      else
        ph.transfers.push_back(
            {g[static_cast<std::size_t>(from)], g[static_cast<std::size_t>(to)], bytes});
    };
    for (int s = 0; s < w; ++s) {
      const int a = s / m, j = s % m;
      for (int b = 0; b < n; ++b) {
        if (b == a) continue;
        add(s, b * m + j, unit * d.node_tokens[static_cast<std::size_t>(s) * n + b]);
      }
    }
    for (int f = 0; f < w; ++f) {  // forwarder (b, j)
      const int b = f / m, j = f % m;
      for (int k = 0; k < m; ++k) {
        if (k == j) continue;
        const int t = b * m + k;
        double tokens = 0;
        for (int a = 0; a < n; ++a)
          tokens += d.gpu_tokens[static_cast<std::size_t>(a * m + j) * w + t];
        add(f, t, unit * tokens);
      }
    }
    if (ph.transfers.empty()) return {};
    return {std::move(ph)};
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    // O(W * (n + m)) transfers: the formula over the lowering itself.
    CollectiveCall plain = call;
    plain.with_layout = false;
    return phases_time(lower(plain, *ctx.topo), ctx);
  }
};

}  // namespace

const Algorithm& deepep_all_to_allv() {
  static const DeepepAllToAllv algo;
  return algo;
}

}  // namespace moesim::collectives::detail
