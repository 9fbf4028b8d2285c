// Linear all-to-all (docs/strategy-specs.md §2): every rank posts its chunk for every other group
// member at once (grouped send/recv). W-1 messages of S/W bytes per rank; the self chunk is a local
// copy that runs concurrently with the transfers.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class LinearAllToAll final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAll; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kLinear; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const std::vector<int>& g = *call.group;
    const int w = group_size(call);
    const double size = call.spec->bytes.value();
    if (w == 0 || size <= 0) return {};
    const double c = size / w;
    Phase ph;
    ph.kind = Phase::Kind::kTransfers;
    ph.label = "linear";
    ph.src = Buffer::kSend;
    ph.dst = Buffer::kRecv;
    ph.local_bytes = Bytes(2 * c);
    ph.transfers.reserve(static_cast<size_t>(w) * (w - 1));
    if (call.with_layout) ph.chunks.reserve(static_cast<size_t>(w) * (w - 1));
    for (int p = 0; p < w; ++p) {
      // Destinations in rotated order (p+1, p+2, ...) so that posting order spreads the load.
      for (int i = 1, q = p + 1; i < w; ++i, ++q) {
        if (q == w) q = 0;  // (p + i) mod w without a division per transfer
        ph.transfers.push_back({g[p], g[q], c});
        if (call.with_layout) ph.chunks.push_back({q * c, p * c});
      }
      if (call.with_layout) ph.copies.push_back({g[p], p * c, p * c, c});
    }
    return {std::move(ph)};
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    const int w = group_size(call);
    const double size = call.spec->bytes.value();
    if (w == 0 || size <= 0) return Seconds(0);
    const double bw = copy_bandwidth(ctx);
    const double local = bw > 0 ? 2 * size / w / bw : 0.0;
    if (w == 1) return Seconds(local);
    const auto prof = linear_profile(call, *ctx.topo);
    const double overhead_s = ctx.net.overhead_s(w - 1);
    const double fixed = ctx.net.message_latency_s + (w - 1) * overhead_s;
    const double chunk = size / w;
    double net = 0;
    for (size_t i = 0; i < prof->intra.size(); ++i) {
      for (const ClassStats* cs : {&prof->intra[i], &prof->inter[i]}) {
        if (cs->count > 0) net = std::max(net, fixed + cs->max_alpha_s + chunk * cs->sum_inv_bw);
      }
    }
    // An oversubscribed fabric: the bytes leaving a leaf (pod, group) share its uplinks.
    const UniformCut& cut = uniform_exchange_cut(call, *ctx.topo);
    if (cut.s_per_byte > 0) {
      net = std::max(net, ctx.net.message_latency_s + prof->inter_max.max_alpha_s +
                              cut.seconds(chunk, overhead_s));
    }
    return Seconds(std::max(net, local));
  }
};

}  // namespace

const Algorithm& linear_all_to_all() {
  static const LinearAllToAll algo;
  return algo;
}

}  // namespace moesim::collectives::detail
