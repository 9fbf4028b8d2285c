// Ring reduce_scatter: W-1 steps of S/W bytes to the ring successor; step t sends chunk
// (p - t - 1) mod W, so position p ends owning the reduced chunk p (at p*S/W in its working
// buffer). The reductions are one kReduce phase after the steps (same total as interleaved).
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
    const double c = size / w;
    std::vector<Phase> phases(2);
    Phase& rs = phases[0];
    rs.kind = Phase::Kind::kTransfers;
    rs.label = "rs_step";
    rs.src = rs.dst = Buffer::kRecv;
    rs.repeat = w - 1;
    append_ring_step(rs, *call.group, c, -1, 0.0, call.with_layout);
    Phase& red = phases[1];
    red.kind = Phase::Kind::kReduce;
    red.label = "rs_reduce";
    red.src = red.dst = Buffer::kRecv;
    red.local_bytes = Bytes(3 * c * (w - 1));
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    const auto shape = scaled_shape(*this, call, *ctx.topo, kTagRingReduceScatter, 0);
    return Seconds(shape_time_s(*shape, call.spec->bytes.value(), ctx));
  }
};

}  // namespace

const Algorithm& ring_reduce_scatter() {
  static const RingReduceScatter algo;
  return algo;
}

}  // namespace moesim::collectives::detail
