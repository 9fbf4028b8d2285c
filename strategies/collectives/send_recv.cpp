// send_recv: every group position p sends spec.bytes to position (p + peer_offset) mod W, all at
// once (pipeline-parallel style neighbour exchange). One message per rank; peer_offset = 0 (mod W)
// moves nothing.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

int normalized_offset(const CollectiveCall& call) {
  const int w = group_size(call);
  return w == 0 ? 0 : ((call.spec->peer_offset % w) + w) % w;
}

class SendRecv final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kSendRecv; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kLinear; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const std::vector<int>& g = *call.group;
    const int w = group_size(call);
    const int off = normalized_offset(call);
    const double size = call.spec->bytes.value();
    if (off == 0 || size <= 0) return {};
    Phase ph;
    ph.kind = Phase::Kind::kTransfers;
    ph.label = "send_recv";
    ph.src = Buffer::kSend;
    ph.dst = Buffer::kRecv;
    for (int p = 0; p < w; ++p) {
      ph.transfers.push_back({g[p], g[(p + off) % w], size});
      if (call.with_layout) ph.chunks.push_back({0.0, 0.0});
    }
    return {std::move(ph)};
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    const int off = normalized_offset(call);
    if (off == 0 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagSendRecv, off);
  }
};

}  // namespace

const Algorithm& send_recv() {
  static const SendRecv algo;
  return algo;
}

}  // namespace moesim::collectives::detail
