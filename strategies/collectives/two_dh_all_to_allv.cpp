// 2DH all_to_allv: the 2DH sequence (stride copy, intra-node phase, stride copy, inter-node
// phase) with per-pair sizes. Blocks keep the 2DH order but have variable sizes, so offsets are
// prefix sums of the permuted block sizes; empty blocks send no message.
#include <algorithm>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

// Aggregated block sizes of one group. Position p = a*m + j (node block a, local index j).
struct Blocks {
  int m = 0, n = 0;
  std::vector<double> intra;  // [p*m + k]: bytes p sends to node peer (a, k) (k == j: self)
  std::vector<double> inter;  // [q*n + b]: bytes q = (a, k) sends to (b, k) (b == a: self)
  std::vector<double> row;    // [p]: row sum (bytes p sends in total, self included)
  double intra_at(int p, int k) const { return intra[static_cast<size_t>(p) * m + k]; }
  double inter_at(int q, int b) const { return inter[static_cast<size_t>(q) * n + b]; }
};

Blocks make_blocks(const ByteMatrix& mat, NodeGrid grid) {
  Blocks bl;
  bl.m = grid.m;
  bl.n = grid.n;
  const int w = grid.m * grid.n;
  bl.intra.assign(static_cast<size_t>(w) * grid.m, 0.0);
  bl.inter.assign(static_cast<size_t>(w) * grid.n, 0.0);
  bl.row.assign(static_cast<size_t>(w), 0.0);
  for (int s = 0; s < w; ++s) {
    const int a = s / grid.m;
    for_each_in_row(mat, s, [&](int d, double v) {
      const int b = d / grid.m, k = d % grid.m;
      bl.intra[static_cast<size_t>(s) * grid.m + k] += v;
      bl.inter[static_cast<size_t>(a * grid.m + k) * grid.n + b] += v;
      bl.row[s] += v;
    });
  }
  return bl;
}

class TwoDhAllToAllv final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAllv; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::k2dh; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology& topo) const override {
    const auto info = grid_info(*call.group, topo);
    return info->grid ? "" : "2dh all_to_allv needs a node-aligned group: " + info->why;
  }

  std::vector<Phase> lower(const CollectiveCall& call,
                           const topology::Topology& topo) const override {
    const NodeGrid grid = require_grid(call, topo, "2dh all_to_allv");
    if (grid.m == 1 || grid.n == 1) return linear_all_to_allv().lower(call, topo);
    const ByteMatrix& mat = require_matrix(call);
    const std::vector<int>& g = *call.group;
    const int m = grid.m, n = grid.n, w = m * n;
    const bool layout = call.with_layout;
    const Blocks bl = make_blocks(mat, grid);
    const auto at = [&](int s, int d) { return mat.at(s, d).value(); };

    std::vector<Phase> phases = two_dh_phases();
    Phase& copy1 = phases[kStrideCopy1];
    Phase& intra = phases[kIntra];
    Phase& copy2 = phases[kStrideCopy2];
    Phase& inter = phases[kInter];

    double max_row = 0, max_intra_self = 0, max_held = 0, max_inter_self = 0;
    // Stride copy 1 and the intra phase. Scratch of p: blocks in slot order k*n + b, so block k
    // (everything for node peer k) starts at the sum of intra_at(p, k') for k' < k.
    std::vector<double> send_off(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) {
      const int a = p / m, j = p % m;
      max_row = std::max(max_row, bl.row[p]);
      max_intra_self = std::max(max_intra_self, bl.intra_at(p, j));
      if (layout) {
        double off = 0;
        for (int d = 0; d < w; ++d) {
          send_off[d] = off;
          off += at(p, d);
        }
        double scr = 0;
        for (int k = 0; k < m; ++k) {
          for (int b = 0; b < n; ++b) {
            const double v = at(p, b * m + k);
            if (v > 0) copy1.copies.push_back({g[p], send_off[b * m + k], scr, v});
            scr += v;
          }
        }
      }
      // Receive offset of p's block on peer (a, k): blocks from local j' < j come first.
      const auto recv_off = [&](int k) {
        double off = 0;
        for (int jj = 0; jj < j; ++jj) off += bl.intra_at(a * m + jj, k);
        return off;
      };
      const auto scr_off = [&](int k) {
        double off = 0;
        for (int kk = 0; kk < k; ++kk) off += bl.intra_at(p, kk);
        return off;
      };
      append_exchange(
          intra, g[p], j, m, [&](int k) { return g[a * m + k]; },
          [&](int k) { return bl.intra_at(p, k); }, scr_off, recv_off, layout);
    }
    // Stride copy 2 and the inter phase, seen from q = (a, k). Its receive buffer holds blocks
    // in slot order j*n + b (source (a, j), destination (b, k)); scratch wants b*m + j.
    for (int q = 0; q < w; ++q) {
      const int a = q / m, k = q % m;
      double held = 0;
      for (int j = 0; j < m; ++j) held += bl.intra_at(a * m + j, k);
      max_held = std::max(max_held, held);
      max_inter_self = std::max(max_inter_self, bl.inter_at(q, a));
      if (layout) {
        std::vector<double> out_start(static_cast<size_t>(n), 0.0);
        for (int b = 1; b < n; ++b) out_start[b] = out_start[b - 1] + bl.inter_at(q, b - 1);
        double in = 0;
        for (int j = 0; j < m; ++j) {
          for (int b = 0; b < n; ++b) {
            const double v = at(a * m + j, b * m + k);
            if (v > 0) {
              double out = out_start[b];
              for (int jj = 0; jj < j; ++jj) out += at(a * m + jj, b * m + k);
              copy2.copies.push_back({g[q], in, out, v});
            }
            in += v;
          }
        }
      }
      const auto send_off2 = [&](int b) {
        double off = 0;
        for (int bb = 0; bb < b; ++bb) off += bl.inter_at(q, bb);
        return off;
      };
      // Standard all_to_allv receive layout on (b, k): sources before a*m come first.
      const auto recv_off2 = [&](int b) {
        double off = 0;
        for (int aa = 0; aa < a; ++aa) off += bl.inter_at(aa * m + k, b);
        return off;
      };
      append_exchange(
          inter, g[q], a, n, [&](int b) { return g[b * m + k]; },
          [&](int b) { return bl.inter_at(q, b); }, send_off2, recv_off2, layout);
    }
    copy1.local_bytes = Bytes(2 * max_row);
    intra.local_bytes = Bytes(2 * max_intra_self);
    copy2.local_bytes = Bytes(2 * max_held);
    inter.local_bytes = Bytes(2 * max_inter_self);
    return phases;
  }

  // O(non-zeros + W*(m+n)): the lowering's per-rank bytes and message counts, priced with the
  // mean 1/bandwidth and max alpha of node peers (intra phase) and same-local-index peers
  // (inter phase) from the representative-rank profile.
  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    const NodeGrid grid = require_grid(call, *ctx.topo, "2dh all_to_allv");
    if (grid.m == 1 || grid.n == 1) return linear_all_to_allv().analytical_time(call, ctx);
    const ByteMatrix& mat = require_matrix(call);
    const int m = grid.m, n = grid.n, w = m * n;
    const Blocks bl = make_blocks(mat, grid);
    const auto prof = two_dh_profile(call, *ctx.topo, grid);
    double intra_alpha = 0, intra_inv = 0, rail_alpha = 0, rail_inv = 0;
    for (size_t i = 0; i < prof->intra.size(); ++i) {
      intra_alpha = std::max(intra_alpha, prof->intra[i].max_alpha_s);
      intra_inv = std::max(intra_inv, prof->intra[i].mean_inv_bw());
      rail_alpha = std::max(rail_alpha, prof->rail[i].max_alpha_s);
      rail_inv = std::max(rail_inv, prof->rail[i].mean_inv_bw());
    }
    const double bw = copy_bandwidth(ctx);
    const auto local = [bw](double bytes) { return bw > 0 ? bytes / bw : 0.0; };
    const auto side = [&](int messages, double bytes, double alpha, double inv) {
      if (messages == 0) return 0.0;
      return ctx.net.message_latency_s + messages * ctx.net.overhead_s(messages) + alpha +
             bytes * inv;
    };
    double max_row = 0, max_held = 0, intra_t = 0, inter_t = 0, intra_self = 0, inter_self = 0;
    for (int p = 0; p < w; ++p) {
      const int a = p / m, j = p % m;
      max_row = std::max(max_row, bl.row[p]);
      int sm = 0, rm = 0;
      double sb = 0, rb = 0, held = 0;
      for (int k = 0; k < m; ++k) {
        const double out = bl.intra_at(p, k);         // p -> (a, k)
        const double in = bl.intra_at(a * m + k, j);  // (a, k) -> p
        held += in;
        if (k == j) continue;
        if (out > 0) ++sm, sb += out;
        if (in > 0) ++rm, rb += in;
      }
      max_held = std::max(max_held, held);
      intra_self = std::max(intra_self, bl.intra_at(p, j));
      intra_t = std::max(
          {intra_t, side(sm, sb, intra_alpha, intra_inv), side(rm, rb, intra_alpha, intra_inv)});
      sm = rm = 0;
      sb = rb = 0;
      for (int b = 0; b < n; ++b) {
        if (b == a) continue;
        const double out = bl.inter_at(p, b);         // p -> (b, j)
        const double in = bl.inter_at(b * m + j, a);  // (b, j) -> p
        if (out > 0) ++sm, sb += out;
        if (in > 0) ++rm, rb += in;
      }
      inter_self = std::max(inter_self, bl.inter_at(p, a));
      inter_t = std::max(
          {inter_t, side(sm, sb, rail_alpha, rail_inv), side(rm, rb, rail_alpha, rail_inv)});
    }
    // The inter phase moves, from node a to node b, exactly the matrix's node-a-to-node-b bytes,
    // so it carries the matrix's fabric cut bound.
    // Overheads: the inter phase sends one message per node pair and local index, m times fewer
    // than the matrix's (approximated by the matrix's bound with overhead / m).
    const double cut = matrix_cut_s(mat, *call.group, *ctx.topo, ctx.net.overhead_s(n - 1) / m);
    if (cut > 0) inter_t = std::max(inter_t, ctx.net.message_latency_s + rail_alpha + cut);
    return Seconds(local(2 * max_row) + std::max(intra_t, local(2 * intra_self)) +
                   local(2 * max_held) + std::max(inter_t, local(2 * inter_self)));
  }
};

}  // namespace

const Algorithm& two_dh_all_to_allv() {
  static const TwoDhAllToAllv algo;
  return algo;
}

}  // namespace moesim::collectives::detail
