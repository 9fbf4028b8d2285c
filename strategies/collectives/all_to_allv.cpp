// Linear all_to_allv: per-pair sizes from a ByteMatrix (dense or CSR), every non-zero entry one
// message, zero entries skipped, the diagonal a local copy. Send buffers are packed by
// destination, receive buffers by source (collective.hpp).
#include <algorithm>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class LinearAllToAllv final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAllv; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kLinear; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const ByteMatrix& mat = require_matrix(call);
    const std::vector<int>& g = *call.group;
    const int w = group_size(call);
    const bool layout = call.with_layout;
    Phase ph;
    ph.kind = Phase::Kind::kTransfers;
    ph.label = "linear";
    ph.src = Buffer::kSend;
    ph.dst = Buffer::kRecv;
    // recv_pos[d]: bytes already placed in d's receive buffer by sources before the current one.
    std::vector<double> recv_pos(static_cast<size_t>(w), 0.0);
    struct Entry {
      int dst;
      double bytes, send_offset, recv_offset;
    };
    std::vector<Entry> row;
    double max_self = 0;
    for (int s = 0; s < w; ++s) {
      row.clear();
      double send_pos = 0;
      for_each_in_row(mat, s, [&](int d, double bytes) {
        row.push_back({d, bytes, send_pos, recv_pos[d]});
        send_pos += bytes;
        recv_pos[d] += bytes;
      });
      // Post in rotated order (first destination after s) like the linear all-to-all.
      const auto first = std::upper_bound(row.begin(), row.end(), s,
                                          [](int v, const Entry& e) { return v < e.dst; });
      std::rotate(row.begin(), first, row.end());
      for (const Entry& e : row) {
        if (e.dst == s) {
          max_self = std::max(max_self, e.bytes);
          if (layout) ph.copies.push_back({g[s], e.send_offset, e.recv_offset, e.bytes});
          continue;
        }
        ph.transfers.push_back({g[s], g[e.dst], e.bytes});
        if (layout) ph.chunks.push_back({e.send_offset, e.recv_offset});
      }
    }
    ph.local_bytes = Bytes(2 * max_self);
    if (ph.transfers.empty() && ph.copies.empty() && max_self == 0) return {};
    return {std::move(ph)};
  }

  // O(non-zeros): per rank, bytes and message counts per peer class on both sides, priced with
  // the class's mean 1/bandwidth and max alpha from the representative-rank profile. With a
  // uniform matrix this equals the linear all_to_all time.
  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    const ByteMatrix& mat = require_matrix(call);
    const std::vector<int>& g = *call.group;
    const topology::Topology& topo = *ctx.topo;
    const int w = group_size(call);
    const auto prof = linear_profile(call, topo);
    double alpha[2] = {0, 0}, inv_bw[2] = {0, 0};
    for (size_t i = 0; i < prof->intra.size(); ++i) {
      alpha[0] = std::max(alpha[0], prof->intra[i].max_alpha_s);
      alpha[1] = std::max(alpha[1], prof->inter[i].max_alpha_s);
      inv_bw[0] = std::max(inv_bw[0], prof->intra[i].mean_inv_bw());
      inv_bw[1] = std::max(inv_bw[1], prof->inter[i].mean_inv_bw());
    }
    struct Side {
      int messages = 0;
      double bytes[2] = {0, 0};
    };
    std::vector<Side> send(static_cast<size_t>(w)), recv(static_cast<size_t>(w));
    std::vector<int> node(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) node[p] = topo.node_of(g[p]);
    double max_self = 0;
    for (int s = 0; s < w; ++s) {
      for_each_in_row(mat, s, [&](int d, double bytes) {
        if (d == s) {
          max_self = std::max(max_self, bytes);
          return;
        }
        const int cls = node[s] == node[d] ? 0 : 1;
        ++send[s].messages;
        send[s].bytes[cls] += bytes;
        ++recv[d].messages;
        recv[d].bytes[cls] += bytes;
      });
    }
    double net = 0;
    for (const auto* sides : {&send, &recv}) {
      for (const Side& sd : *sides) {
        if (sd.messages == 0) continue;
        double worst = 0;
        for (int k = 0; k < 2; ++k)
          if (sd.bytes[k] > 0) worst = std::max(worst, alpha[k] + sd.bytes[k] * inv_bw[k]);
        net = std::max(
            net, ctx.net.message_latency_s + sd.messages * ctx.net.overhead_s(sd.messages) + worst);
      }
    }
    // An oversubscribed fabric: the bytes leaving a leaf (pod, group) share its uplinks.
    int max_sent = 0;
    for (const Side& sd : send) max_sent = std::max(max_sent, sd.messages);
    const double cut = matrix_cut_s(mat, g, topo, ctx.net.overhead_s(max_sent));
    if (cut > 0) net = std::max(net, ctx.net.message_latency_s + alpha[1] + cut);
    const double bw = copy_bandwidth(ctx);
    const double local = bw > 0 ? 2 * max_self / bw : 0.0;
    return Seconds(std::max(net, local));
  }
};

}  // namespace

const Algorithm& linear_all_to_allv() {
  static const LinearAllToAllv algo;
  return algo;
}

}  // namespace moesim::collectives::detail
