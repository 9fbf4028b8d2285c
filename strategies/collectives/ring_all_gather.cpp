// Ring all_gather (S = output bytes per rank, each rank contributes S/W): a self copy of the own
// chunk into its output slot (kSend -> kRecv at p*S/W), then W-1 steps where position p sends
// chunk (p - t) mod W to its ring successor.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class RingAllGather final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllGather; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kRing; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const std::vector<int>& g = *call.group;
    const int w = group_size(call);
    const double size = call.spec->bytes.value();
    if (w < 1 || size <= 0) return {};
    const double c = size / w;
    std::vector<Phase> phases(1);
    Phase& self = phases[0];
    self.kind = Phase::Kind::kCopy;
    self.label = "self_copy";
    self.src = Buffer::kSend;
    self.dst = Buffer::kRecv;
    self.local_bytes = Bytes(2 * c);
    if (call.with_layout)
      for (int p = 0; p < w; ++p) self.copies.push_back({g[p], 0.0, p * c, c});
    append_ring_all_gather(phases, std::span<const std::vector<int>>(&g, 1), c, 0.0, kFlatRing,
                           call.with_layout);
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 1 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagRingAllGather, 0);
  }
};

}  // namespace

const Algorithm& ring_all_gather() {
  static const RingAllGather algo;
  return algo;
}

}  // namespace moesim::collectives::detail
