// Ring all_reduce (NCCL's ring): exactly the ring reduce_scatter's phases (W-1 steps of S/W to
// the ring successor in group order, then the reductions), followed by the in-place ring
// all-gather steps (W-1 steps, position p starting from its reduced chunk p); both come from the
// shared helpers in common.hpp, so the three ring collectives cannot drift apart.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class RingAllReduce final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllReduce; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kRing; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const int w = group_size(call);
    const double size = call.spec->bytes.value();
    if (w < 2 || size <= 0) return {};
    const std::span<const std::vector<int>> ring(call.group, 1);
    std::vector<Phase> phases;
    append_ring_reduce_scatter(phases, ring, size / w, 0.0, kFlatRing, call.with_layout);
    append_ring_all_gather(phases, ring, size / w, 0.0, kFlatRing, call.with_layout);
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagRingAllReduce, 0);
  }
};

}  // namespace

const Algorithm& ring_all_reduce() {
  static const RingAllReduce algo;
  return algo;
}

}  // namespace moesim::collectives::detail
