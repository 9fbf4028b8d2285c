// 2DH (two-dimensional hierarchical) all-to-all (Tutel §3.4, Alg. 1; STRATEGIES §2). For a
// node-aligned group of n nodes x m ranks: stride copy, intra-node all-to-all of n-chunk blocks,
// stride copy, inter-node all-to-all of m-chunk blocks between same-local-index ranks. Each rank
// sends (m-1) + (n-1) messages instead of W-1, at the price of two full-buffer copies and more
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
    const NodeGrid grid = require_grid(call, topo);
    const int m = grid.m, n = grid.n;
    // One node or one rank per node: both hierarchical phases collapse into one, i.e. linear.
    if (m == 1 || n == 1) return linear_all_to_all().lower(call, topo);
    const std::vector<int>& g = *call.group;
    const int w = m * n;
    const double size = call.spec->bytes.value();
    if (size <= 0) return {};
    const double c = size / w;
    const bool layout = call.with_layout;

    std::vector<Phase> phases(4);
    Phase& copy1 = phases[0];
    copy1.kind = Phase::Kind::kCopy;
    copy1.label = "stride_copy_1";
    copy1.src = Buffer::kSend;
    copy1.dst = Buffer::kScratch;
    copy1.stride_h = m;
    copy1.stride_w = n;
    copy1.chunk_bytes = c;
    copy1.local_bytes = Bytes(2 * size);

    Phase& intra = phases[1];
    intra.kind = Phase::Kind::kTransfers;
    intra.label = "intra";
    intra.src = Buffer::kScratch;
    intra.dst = Buffer::kRecv;
    intra.local_bytes = Bytes(2 * n * c);
    intra.transfers.reserve(static_cast<size_t>(w) * (m - 1));
    for (int p = 0; p < w; ++p) {
      const int a = p / m, j = p % m;
      for (int i = 1; i < m; ++i) {
        const int k = (j + i) % m;
        intra.transfers.push_back({g[p], g[a * m + k], n * c});
        if (layout) intra.chunks.push_back({k * n * c, j * n * c});
      }
      if (layout) intra.copies.push_back({g[p], j * n * c, j * n * c, n * c});
    }

    Phase& copy2 = phases[2];
    copy2.kind = Phase::Kind::kCopy;
    copy2.label = "stride_copy_2";
    copy2.src = Buffer::kRecv;
    copy2.dst = Buffer::kScratch;
    copy2.stride_h = n;
    copy2.stride_w = m;
    copy2.chunk_bytes = c;
    copy2.local_bytes = Bytes(2 * size);

    Phase& inter = phases[3];
    inter.kind = Phase::Kind::kTransfers;
    inter.label = "inter";
    inter.src = Buffer::kScratch;
    inter.dst = Buffer::kRecv;
    inter.local_bytes = Bytes(2 * m * c);
    inter.transfers.reserve(static_cast<size_t>(w) * (n - 1));
    for (int p = 0; p < w; ++p) {
      const int a = p / m, k = p % m;
      for (int i = 1; i < n; ++i) {
        const int b = (a + i) % n;
        inter.transfers.push_back({g[p], g[b * m + k], m * c});
        if (layout) inter.chunks.push_back({b * m * c, a * m * c});
      }
      if (layout) inter.copies.push_back({g[p], a * m * c, a * m * c, m * c});
    }
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    const NodeGrid grid = require_grid(call, *ctx.topo);
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
      intra = std::max(intra, ctx.net.message_latency_s + (m - 1) * ctx.net.message_overhead_s +
                                  a.max_alpha_s + size / m * a.sum_inv_bw);
      inter = std::max(inter, ctx.net.message_latency_s + (n - 1) * ctx.net.message_overhead_s +
                                  r.max_alpha_s + size / n * r.sum_inv_bw);
    }
    intra = std::max(intra, local(2 * size / m));
    inter = std::max(inter, local(2 * size / n));
    return Seconds(2 * local(2 * size) + intra + inter);
  }

 private:
  NodeGrid require_grid(const CollectiveCall& call, const topology::Topology& topo) const {
    const auto info = grid_info(*call.group, topo);
    if (!info->grid) throw InputError("2dh all_to_all needs a node-aligned group: " + info->why);
    const auto grid = info->grid;
    return *grid;
  }
};

}  // namespace

const Algorithm& two_dh_all_to_all() {
  static const TwoDhAllToAll algo;
  return algo;
}

}  // namespace moesim::collectives::detail
