// Ring reduce_scatter: W-1 steps of S/W bytes to the ring successor; step t sends chunk
// (p - t - 1) mod W, so position p ends owning the reduced chunk p (at p*S/W in its working
// buffer). The reductions are one kReduce phase after the steps (same total as interleaved).
// The lowering is append_ring_reduce_scatter (common.hpp), shared with ring all_reduce.
#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

class RingReduceScatter final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kReduceScatter; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kRing; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const int w = group_size(call);
    const double size = call.spec->bytes.value();
    if (w < 2 || size <= 0) return {};
    std::vector<Phase> phases;
    append_ring_reduce_scatter(phases, std::span<const std::vector<int>>(call.group, 1), size / w,
                               0.0, kFlatRing, call.with_layout);
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagRingReduceScatter, 0);
  }
};

}  // namespace

const Algorithm& ring_reduce_scatter() {
  static const RingReduceScatter algo;
  return algo;
}

}  // namespace moesim::collectives::detail
