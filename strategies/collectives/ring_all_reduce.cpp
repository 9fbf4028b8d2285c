// Ring all_reduce (NCCL's ring): reduce-scatter in W-1 steps, then all-gather in W-1 steps, each
// step every rank sending S/W bytes to its ring successor (group order). Step t of the
// reduce-scatter sends chunk (p - t - 1) mod W, so position p ends owning reduced chunk p; step t
// of the all-gather sends chunk (p - t) mod W. The W-1 reductions of S/W bytes are one kReduce
// phase after the reduce-scatter steps: phases run in sequence, so the total is the same as
// interleaving them.
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
    const double c = size / w;
    std::vector<Phase> phases(3);
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
    Phase& ag = phases[2];
    ag.kind = Phase::Kind::kTransfers;
    ag.label = "ag_step";
    ag.src = ag.dst = Buffer::kRecv;
    ag.repeat = w - 1;
    append_ring_step(ag, *call.group, c, 0, 0.0, call.with_layout);
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    const auto shape = scaled_shape(*this, call, *ctx.topo, kTagRingAllReduce, 0);
    return Seconds(shape_time_s(*shape, call.spec->bytes.value(), ctx));
  }
};

}  // namespace

const Algorithm& ring_all_reduce() {
  static const RingAllReduce algo;
  return algo;
}

}  // namespace moesim::collectives::detail
