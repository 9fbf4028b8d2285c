// DeepEP-style all_to_allv (DeepSeek-V3's dispatch; docs/strategy-specs.md §2): tokens deduplicated
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
// the forwarding buffers. With layout (exec/), the two sets are two phases in order, at the row
// offsets lower() lists; exec's data path (exec/deepep_path.hpp) packs and reduces the rows
// between them.
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
    const bool combine = call.spec->dedup_combine;
    const auto node_tokens = [&](int s, int b) {
      return static_cast<double>(d.node_tokens[static_cast<std::size_t>(s) * n + b]);
    };
    // fwd[j * w + t]: rows forwarder (b, j) sends on to position t of node b = t / m: every
    // source of rail j's tokens with an expert on t (its own node's included).
    std::vector<double> fwd(static_cast<std::size_t>(m) * w, 0.0);
    for (int j = 0; j < m; ++j)
      for (int t = 0; t < w; ++t)
        for (int a = 0; a < n; ++a)
          fwd[static_cast<std::size_t>(j) * w + t] +=
              d.gpu_tokens[static_cast<std::size_t>(a * m + j) * w + t];
    const auto fwd_tokens = [&](int j, int t) { return fwd[static_cast<std::size_t>(j) * w + t]; };
    // Without layout (the simulator): one phase of both sets, as DeepEP pipelines them.
    // With layout (exec/): the inter set, then the intra set, each a phase of its own (the
    // forwarder sends on what arrived; exec does not pipeline the two), at these row offsets:
    //  inter send, at source s = (a, j):  blocks per node b != a, ascending b;
    //  inter recv, at forwarder (b, j):   blocks per source node a != b, ascending a;
    //  intra send, at forwarder (b, j):   blocks per target (b, k), ascending k, k = j included;
    //  intra recv, at target (b, k):      blocks per forwarder (b, j), ascending j, j = k included
    //                                     (the forwarder's own block is a local copy).
    // The combine runs the intra set reversed, then the inter set reversed, on the same offsets
    // with the send and receive sides swapped.
    const bool layout = call.with_layout;
    Phase inter, intra;
    inter.kind = intra.kind = Phase::Kind::kTransfers;
    if (!layout) {
      inter.label = combine ? "combine" : "dispatch";
    } else {
      inter.label = combine ? "combine_inter" : "dispatch_inter";
      intra.label = combine ? "combine_intra" : "dispatch_intra";
    }
    Phase& second = layout ? intra : inter;
    auto add = [&](Phase& ph, int from, int to, double bytes, double from_off, double to_off) {
      if (bytes <= 0) return;
      const int src = g[static_cast<std::size_t>(combine ? to : from)];
      const int dst = g[static_cast<std::size_t>(combine ? from : to)];
      ph.transfers.push_back({src, dst, bytes});
      if (layout) {
        if (combine)
          ph.chunks.push_back({to_off, from_off});
        else
          ph.chunks.push_back({from_off, to_off});
      }
    };
    for (int s = 0; s < w; ++s) {
      const int a = s / m, j = s % m;
      double send_off = 0;
      for (int b = 0; b < n; ++b) {
        if (b == a) continue;
        double recv_off = 0;  // offsets only for the layout (the simulator's lowering is hot)
        if (layout)
          for (int a2 = 0; a2 < a; ++a2)
            if (a2 != b) recv_off += node_tokens(a2 * m + j, b);
        add(inter, s, b * m + j, unit * node_tokens(s, b), unit * send_off, unit * recv_off);
        send_off += node_tokens(s, b);
      }
    }
    for (int f = 0; f < w; ++f) {  // forwarder (b, j)
      const int b = f / m, j = f % m;
      double send_off = 0;
      for (int k = 0; k < m; ++k) {
        const int t = b * m + k;
        const double tokens = fwd_tokens(j, t);
        double recv_off = 0;
        if (layout)
          for (int j2 = 0; j2 < j; ++j2) recv_off += fwd_tokens(j2, t);
        if (k != j)
          add(second, f, t, unit * tokens, unit * send_off, unit * recv_off);
        else if (layout && tokens > 0)
          second.copies.push_back({g[static_cast<std::size_t>(f)],
                                   unit * (combine ? recv_off : send_off),
                                   unit * (combine ? send_off : recv_off), unit * tokens});
        send_off += tokens;
      }
    }
    std::vector<Phase> out;
    if (!layout) {
      if (!inter.transfers.empty()) out.push_back(std::move(inter));
      return out;
    }
    // Both phases always (a rank may own every token it forwards: the self copies still run).
    if (combine) {
      out.push_back(std::move(intra));
      out.push_back(std::move(inter));
    } else {
      out.push_back(std::move(inter));
      out.push_back(std::move(intra));
    }
    return out;
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
